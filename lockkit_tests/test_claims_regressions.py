"""Regressions found by breaking lockkit.claims on purpose: each failed before its fix."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from django.db import connection
from django.db.models import Window
from django.db.models.functions import RowNumber
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit.claims import claim, claim_next, complete_many, heartbeat, release_many
from lockkit_tests.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_same_row_as_int_and_str_pk_is_refused_before_sql() -> None:
    job = Job.objects.create(name="a")
    (held,) = claim_next(Job.objects.all(), worker="w", lease=60)
    twin = replace(held, pk=str(held.pk))
    with CaptureQueriesContext(connection) as queries, pytest.raises(ValueError, match="same row"):
        complete_many([held, twin], set={"state": "done"})
    assert len(queries) == 0
    job.refresh_from_db()
    assert job.state == "pending"
    assert job.lease_expires_at is not None  # still claimed: nothing was written


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_an_instance_is_claimed_on_its_own_database_only() -> None:
    job = Job.objects.create(name="on-default")
    twin = Job.objects.using("other").create(pk=job.pk, name="on-other")
    with pytest.raises(lockkit.AliasMismatch):
        claim(job, worker="w", lease=60, using="other")
    assert Job.objects.using("other").get(pk=twin.pk).claimed_by in (None, "")


@pytest.mark.parametrize("lease", [-5.0, 0.0, float("nan")])
def test_a_travelled_claim_with_a_bad_lease_is_refused_before_sql(lease: float) -> None:
    Job.objects.create(name="a")
    (held,) = claim_next(Job.objects.all(), worker="w", lease=60)
    with CaptureQueriesContext(connection) as queries, pytest.raises(ValueError, match="lease"):
        heartbeat(replace(held, lease=lease))
    assert len(queries) == 0


@pytest.mark.parametrize(("field", "value"), [("token", 2**64), ("token", -1), ("token", True), ("pk", None)])
def test_a_travelled_claim_with_a_bad_token_or_pk_is_refused_before_sql(field: str, value: Any) -> None:
    Job.objects.create(name="a")
    (held,) = claim_next(Job.objects.all(), worker="w", lease=60)
    with CaptureQueriesContext(connection) as queries, pytest.raises(ValueError, match=field):
        complete_many([replace(held, **{field: value})])
    assert len(queries) == 0


def test_empty_batches_still_check_the_type_of_set() -> None:
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(TypeError, match="set"):
            complete_many([], set=[("state", "done")])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="set"):
            release_many([], set="pending")  # type: ignore[arg-type]
        complete_many([], set={"state": "done"})  # nothing to write
    assert len(queries) == 0


def test_worker_names_with_nul_and_window_ordering_are_refused_before_sql() -> None:
    Job.objects.create(name="a")
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(ValueError, match="NUL"):
            claim_next(Job.objects.all(), worker="w\x00x", lease=60)
        with pytest.raises(ValueError, match="window"):
            claim_next(Job.objects.all(), worker="w", lease=60, order_by=[Window(RowNumber(), order_by="pk")])
    assert len(queries) == 0
