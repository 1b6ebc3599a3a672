"""MariaDB/MySQL: claim_next ordered by a column no index covers still skips only the rows other claims hold.

InnoDB locks every row a locking read examines; ordered by an unindexed column, ``SELECT ... ORDER BY ... LIMIT n
FOR UPDATE SKIP LOCKED`` examines (and locks) every candidate before sorting, so one claim in flight used to hide
every free job from the others.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections, transaction

from lockkit.claims import claim_next, complete
from lockkit.testing import in_thread
from lockkit_tests.models import Job, OwnedJob, Owner, RankedJob
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


@pytest.mark.parametrize("alias", VENDORS[:2])
def test_a_claim_in_flight_holds_no_free_row_beyond_those_it_took(alias: str) -> None:
    # Inserted out of name order, so primary-key order and the order asked differ.
    Job.objects.using(alias).bulk_create([Job(name=name) for name in ("c", "a", "b")])
    jobs = Job.objects.using(alias).filter(state="pending")
    order_by = ["name"]
    first, second, third = (jobs.get(name=name).pk for name in "abc")
    a_started, a_done, b_started, b_done = (threading.Event() for _ in range(4))
    a = in_thread(_claim_in_flight, alias, jobs, order_by, a_started, a_done)
    try:
        assert a_started.wait(10)
        # B finds "a" held by A and takes "b"; "c", which nobody claimed, must stay free for others.
        b = in_thread(_claim_in_flight, alias, jobs, order_by, b_started, b_done)
        assert b_started.wait(10)
        got = claim_next(jobs, worker="fast", lease=30, order_by=order_by)
    finally:
        a_done.set()
        b_done.set()
    assert [c.pk for c in a.result(timeout=10)] == [first]
    assert [c.pk for c in b.result(timeout=10)] == [second]
    assert [c.pk for c in got] == [third]


@pytest.mark.parametrize("alias", VENDORS[:2])
def test_a_claim_stalled_while_others_take_its_whole_window_still_finds_a_free_job(alias: str) -> None:
    total = 60
    Job.objects.using(alias).bulk_create([Job(name=f"n{(i * 37) % total:03d}") for i in range(total)])
    jobs = Job.objects.using(alias).filter(state="pending")
    expected = list(jobs.order_by("name").values_list("pk", flat=True))
    stalled, resume = threading.Event(), threading.Event()

    def stall_before_locking(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        # Django's documented instrumentation hook: hold the claim after it read its candidates, before it locks.
        if "SKIP LOCKED" in sql and not stalled.is_set():
            stalled.set()
            assert resume.wait(10)
        return execute(sql, params, many, context)

    def stalled_claim() -> list[Any]:
        with connections[alias].execute_wrapper(stall_before_locking):
            return claim_next(jobs, worker="stalled", lease=30, order_by=["name"])

    slow = in_thread(stalled_claim)
    try:
        assert stalled.wait(10)
        # More jobs than one window of candidates (36 for one row) are taken and finished meanwhile.
        for _ in range(36):
            (claim,) = claim_next(jobs, worker="fast", lease=30, order_by=["name"])
            complete(claim, set={"state": "done"})
    finally:
        resume.set()
    assert [c.pk for c in slow.result(timeout=10)] == [expected[36]]


@pytest.mark.parametrize("alias", VENDORS[:2])
def test_a_claim_filtered_across_a_relation_leaves_the_related_row_unlocked(alias: str) -> None:
    # MariaDB has no FOR UPDATE OF: locking with the join locked the owner row, so a claim in flight (or an edit
    # of the owner) hid every other job of that owner.
    owner = Owner.objects.using(alias).create(name="acme")
    OwnedJob.objects.using(alias).bulk_create([OwnedJob(name=f"j{i}", owner=owner) for i in range(3)])
    jobs = OwnedJob.objects.using(alias).filter(owner__name="acme")
    expected = list(jobs.order_by("pk").values_list("pk", flat=True))
    started, done = threading.Event(), threading.Event()
    slow = in_thread(_claim_in_flight, alias, jobs, ["pk"], started, done)
    try:
        assert started.wait(10)
        fast = claim_next(jobs, worker="fast", lease=30, order_by=["pk"])
    finally:
        done.set()
    assert [c.pk for c in slow.result(timeout=10)] == expected[:1]
    assert [c.pk for c in fast] == expected[1:2]
    # The owner's row held by another session (an edit): the jobs are still claimable.
    held, release = threading.Event(), threading.Event()

    def edit_owner() -> None:
        with transaction.atomic(using=alias):
            Owner.objects.using(alias).select_for_update().get(pk=owner.pk)
            held.set()
            assert release.wait(10)

    editor = in_thread(edit_owner)
    try:
        assert held.wait(10)
        again = claim_next(jobs, worker="fast", lease=30, order_by=["pk"])
    finally:
        release.set()
    editor.result(timeout=10)
    assert [c.pk for c in again] == expected[2:3]


@pytest.mark.parametrize("alias", VENDORS[:2])
def test_a_candidate_listed_twice_by_a_multi_valued_filter_counts_once(alias: str) -> None:
    owner = Owner.objects.using(alias).create(name="acme")
    OwnedJob.objects.using(alias).bulk_create([OwnedJob(name=f"j{i}", owner=owner) for i in range(4)])
    # Through the owner's jobs (multi-valued), every job of the owner matches twice.
    jobs = OwnedJob.objects.using(alias).filter(owner__ownedjob__name__in=["j0", "j1"])
    expected = sorted(OwnedJob.objects.using(alias).values_list("pk", flat=True))
    claims = claim_next(jobs, worker="w", lease=30, order_by=["pk"], limit=2)
    assert [c.pk for c in claims] == expected[:2]


@pytest.mark.parametrize("alias", VENDORS[:2])
def test_many_rows_held_ahead_cost_a_claim_few_statements(alias: str) -> None:
    held_ahead = 200
    Job.objects.using(alias).bulk_create([Job(name=f"n{i:03d}") for i in range(held_ahead + 20)])
    jobs = Job.objects.using(alias).filter(state="pending")
    expected = list(jobs.order_by("pk").values_list("pk", flat=True))
    started, done = threading.Event(), threading.Event()
    # Another session holds the first rows (a claim of them, still uncommitted: free to the others' reads).
    holder = in_thread(_claim_in_flight, alias, jobs, ["pk"], started, done, held_ahead)
    statements: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    try:
        assert started.wait(10)
        with connections[alias].execute_wrapper(count):
            claims = claim_next(jobs, worker="fast", lease=30, order_by=["pk"])
    finally:
        done.set()
    assert len(holder.result(timeout=10)) == held_ahead
    assert [c.pk for c in claims] == expected[held_ahead : held_ahead + 1]
    # One locking probe per row held ahead was 200 statements and more; doubling batches past the first skips.
    assert len(statements) <= 40, len(statements)
