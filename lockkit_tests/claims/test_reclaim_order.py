"""``manage.py lockkit_reclaim`` lists the primary keys it handed back (and marked exhausted) in ascending order,
whatever order the database's ``UPDATE ... RETURNING`` gave them in (PostgreSQL returns them in heap order)."""

from __future__ import annotations

import logging
from io import StringIO

import pytest
from django.core.management import call_command
from django.db.models import F
from django.db.models.functions import Concat

from lockkit.claims import claim
from lockkit.claims.api import reclaim_expired_pks
from lockkit_tests.models import Job
from lockkit_tests.support.claims_vendors import claims_vendor_params, expire

VENDORS = claims_vendor_params()


def _expired_jobs(alias: str, count: int) -> list[int]:
    """``count`` claimed jobs whose lease expired; the lower half rewritten last, so they sit at the heap's end."""
    jobs = [Job.objects.using(alias).create(name=f"job-{i}") for i in range(count)]
    for job in jobs:
        assert claim(job, worker="w", lease=60, using=alias) is not None
    pks = sorted(job.pk for job in jobs)
    # PostgreSQL writes a new row version at the end of the table: the lowest pks now come last in a scan.
    for pk in pks[: count // 2]:
        Job.objects.using(alias).filter(pk=pk).update(result=Concat(F("result"), F("name")))
    expire(alias, *pks)
    return pks


@pytest.mark.parametrize("alias", VENDORS)
def test_reclaim_expired_pks_are_ascending(alias: str) -> None:
    pks = _expired_jobs(alias, 8)
    assert reclaim_expired_pks(Job.objects.using(alias), set={"state": "pending"}) == pks


@pytest.mark.parametrize("alias", VENDORS)
def test_the_command_lists_them_ascending(alias: str, caplog: pytest.LogCaptureFixture) -> None:
    pks = _expired_jobs(alias, 8)
    Job.objects.using(alias).filter(pk__in=pks[1::2]).update(attempts=3)  # every other one is exhausted
    out = StringIO()
    with caplog.at_level(logging.INFO, logger="lockkit.claims.reaper"):
        call_command(
            "lockkit_reclaim",
            "lockkit_tests.Job",
            "--database",
            alias,
            "--set",
            "state=pending",
            "--max-attempts",
            "3",
            "--exhausted-set",
            "state=failed",
            stdout=out,
        )
    back, exhausted = pks[0::2], pks[1::2]
    lines = [
        f"lockkit_tests.Job: handed back 4 expired claim(s): pk {', '.join(map(str, back))}",
        f"lockkit_tests.Job: exhausted 4 expired claim(s): pk {', '.join(map(str, exhausted))}",
    ]
    assert out.getvalue().splitlines() == lines
    assert [record.getMessage() for record in caplog.records] == lines
