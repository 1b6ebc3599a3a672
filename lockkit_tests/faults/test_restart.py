"""A server restart in the middle of a worker loop: the loop carries on within the retry budget (issue 11, item 3).

The server is a throwaway cluster this test starts (``initdb`` + ``pg_ctl`` on a free port), restarted with
``pg_ctl restart -m fast`` (it terminates every session, then refuses connections until it is back).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.db import connections

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.claims import claim_next, complete, heartbeat
from lockkit_harness.cluster import TempCluster, missing_binaries
from lockkit_tests.models import Item, Job, JobLog, Owner, Stock
from lockkit_tests.support.faultkit import create_tables, extra_alias

MISSING = missing_binaries()
ALIAS = "restartable"
JOIN = 60.0

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=f"no throwaway cluster: {MISSING}"),
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS]),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[TempCluster]:
    with TempCluster() as started:
        yield started


@pytest.fixture
def alias(cluster: TempCluster) -> Iterator[str]:
    with extra_alias(ALIAS, "default", HOST="127.0.0.1", PORT=cluster.port, NAME="postgres", OPTIONS={}):
        with connections[ALIAS].cursor() as cursor:
            cursor.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        create_tables(ALIAS, Stock, Owner, Item, Job, JobLog)
        yield ALIAS
        connections[ALIAS].close()


def _restart_in_background(cluster: TempCluster) -> tuple[threading.Thread, list[float]]:
    took: list[float] = []
    thread = threading.Thread(target=lambda: took.append(cluster.restart("fast")), daemon=True)
    thread.start()
    return thread, took


def test_locked_operation_loop_rides_out_a_restart_with_the_default_backoff(
    cluster: TempCluster, alias: str
) -> None:
    Stock.objects.using(alias).create(sku="widget", available=100)
    events: list[RetryEvent] = []

    @lockkit.locked_operation(alias, retry=RetryPolicy(before_retry=events.append))
    def reserve() -> int:
        row = lockkit.current_scope().get(Stock, pk="widget")
        row.available -= 1
        row.save(using=alias)
        Item.objects.using(alias).create(name="sale")
        return row.available

    results = [reserve() for _ in range(5)]
    restarter, took = _restart_in_background(cluster)
    # These calls run while the server shuts down, is down, and comes back: each must succeed.
    while restarter.is_alive() and len(results) < 90:
        results.append(reserve())
    restarter.join(JOIN)
    assert not restarter.is_alive()
    results += [reserve() for _ in range(5)]
    count = len(results)
    assert results == list(range(99, 99 - count, -1))
    assert took
    assert took[0] > 0
    assert events, "no call hit the restart: the test proved nothing"
    assert {event.failure for event in events} == {Failure.CONNECTION_LOST}
    assert Stock.objects.using(alias).get().available == 100 - count
    assert Item.objects.using(alias).count() == count


def test_a_claims_worker_loop_survives_a_restart_without_code_of_its_own(
    cluster: TempCluster, alias: str
) -> None:
    Job.objects.using(alias).bulk_create([Job(name=f"job-{n}") for n in range(12)])
    done: list[int] = []
    restarted = False
    while True:
        found = claim_next(
            Job.objects.using(alias).filter(state="pending"), worker="w1", lease=30, set={"state": "running"}
        )
        if not found:
            break
        (held,) = found
        if len(done) == 4 and not restarted:
            cluster.restart("fast")  # mid-job: between the claim and the heartbeat
            restarted = True
        held = heartbeat(held)
        complete(held, set={"state": "done"})
        JobLog.objects.using(alias).create(job_id=held.pk, worker="w1", token=held.token)
        done.append(held.pk)
    assert restarted
    assert len(done) == 12
    assert Job.objects.using(alias).filter(state="done").count() == 12
    assert JobLog.objects.using(alias).count() == 12
