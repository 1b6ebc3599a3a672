"""MariaDB/MySQL: claim_next ordered by a column no index covers still skips only the rows other claims hold.

InnoDB locks every row a locking read examines; ordered by an unindexed column, ``SELECT ... ORDER BY ... LIMIT n
FOR UPDATE SKIP LOCKED`` examines (and locks) every candidate before sorting, so one claim in flight used to hide
every free job from the others.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import transaction

from lockkit.claims import claim_next, complete
from lockkit.testing import in_thread
from lockkit_tests.models import Job, RankedJob
from lockkit_tests.support.claims_vendors import claims_vendor_params

VENDORS = claims_vendor_params()


def _claim_in_flight(
    alias: str,
    queryset: Any,
    order_by: list[Any],
    started: threading.Event,
    done: threading.Event,
    limit: int = 1,
) -> list[Any]:
    """A claim whose transaction stays open (its row locks held) until ``done``."""
    with transaction.atomic(using=alias):
        claims = claim_next(queryset, worker="slow", lease=30, order_by=order_by, limit=limit)
        started.set()
        assert done.wait(10)
    return claims


@pytest.mark.parametrize("alias", VENDORS[:2])
@pytest.mark.parametrize(
    "order_by", [["-priority", "pk"], ["name"], ["pk"]], ids=["unindexed-desc", "unindexed", "pk"]
)
def test_a_claim_in_flight_hides_only_its_own_rows(alias: str, order_by: list[Any]) -> None:
    rows = RankedJob.objects.using(alias).bulk_create(
        [RankedJob(name=f"n{i:03d}", priority=i % 7) for i in range(40)]
    )
    jobs = RankedJob.objects.using(alias).filter(state="pending")
    expected = list(jobs.order_by(*order_by).values_list("pk", flat=True))
    started, done = threading.Event(), threading.Event()
    slow = in_thread(_claim_in_flight, alias, jobs, order_by, started, done)
    assert started.wait(10)
    try:
        got = [claim_next(jobs, worker="fast", lease=30, order_by=order_by) for _ in range(3)]
        batch = claim_next(jobs, worker="fast", lease=30, order_by=order_by, limit=5)
    finally:
        done.set()
    (held,) = slow.result(timeout=10)
    assert held.pk == expected[0]
    # Every poll got a job, the next ones in the order asked, skipping only the row in flight.
    assert [[c.pk for c in claims] for claims in got] == [[pk] for pk in expected[1:4]]
    assert [c.pk for c in batch] == expected[4:9]
    assert len(rows) == 40


@pytest.mark.parametrize("alias", VENDORS[:2])
def test_a_window_of_candidates_all_held_by_others_moves_to_the_next(alias: str) -> None:
    RankedJob.objects.using(alias).bulk_create(
        [RankedJob(name=f"n{i:03d}", priority=i % 5) for i in range(60)]
    )
    jobs = RankedJob.objects.using(alias)
    order_by = ["-priority", "name"]
    expected = list(jobs.order_by(*order_by).values_list("pk", flat=True))
    started, done = threading.Event(), threading.Event()
    # 40 rows in flight: more than the 36 candidates one claim of one row reads at first.
    slow = in_thread(_claim_in_flight, alias, jobs, order_by, started, done, 40)
    assert started.wait(10)
    try:
        (claim,) = claim_next(jobs, worker="fast", lease=30, order_by=order_by)
    finally:
        done.set()
    assert [c.pk for c in slow.result(timeout=10)] == expected[:40]
    assert claim.pk == expected[40]


@pytest.mark.parametrize("alias", VENDORS)
def test_two_workers_ordered_by_an_unindexed_column_never_poll_empty_while_jobs_remain(alias: str) -> None:
    total = 120
    Job.objects.using(alias).bulk_create([Job(name=f"n{(i * 37) % total:03d}") for i in range(total)])
    jobs = Job.objects.using(alias).filter(state="pending")
    barrier = threading.Barrier(2)

    def work(worker: str) -> tuple[list[Any], int]:
        done: list[Any] = []
        empty = 0
        barrier.wait(10)
        while True:
            claims = claim_next(jobs, worker=worker, lease=30, order_by=["name"], set={"state": "running"})
            if not claims:
                pending = Job.objects.using(alias).filter(state="pending").count()
                if pending == 0:
                    return done, empty
                # The other worker's claim in flight holds one pending row: more than that, and one was free.
                empty += pending > 1
                continue
            complete(claims[0], set={"state": "done", "result": worker})
            done.append(claims[0].pk)

    a, b = in_thread(work, "a"), in_thread(work, "b")
    (done_a, empty_a), (done_b, empty_b) = a.result(timeout=60), b.result(timeout=60)
    assert sorted(done_a + done_b) == sorted(Job.objects.using(alias).values_list("pk", flat=True))
    assert (empty_a, empty_b) == (0, 0)
