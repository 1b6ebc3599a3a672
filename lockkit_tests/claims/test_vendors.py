"""lockkit.claims on PostgreSQL, MariaDB and SQLite: the same guarantees, proven by the same contention tests."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.db.backends.signals import connection_created
from django.test import override_settings
from django.utils import timezone

from lockkit import LockTimeout, locked_operation
from lockkit.claims import (
    Claim,
    StaleClaim,
    claim,
    claim_next,
    complete,
    complete_many,
    fenced,
    heartbeat,
    heartbeat_every,
    reclaim_expired,
    release,
)
from lockkit.testing import hold_lock, in_thread, run_concurrently, wait_until_blocked
from lockkit_tests.models import Job, JobEffect, JobLog
from lockkit_tests.support.claims_vendors import claims_vendor_params, db_now, expire
from lockkit_tests.support.vendors import vendor_params

pytestmark = pytest.mark.contention
VENDORS = claims_vendor_params()

# Jobs drained by 8 workers per vendor: SQLite runs one writer at a time (BEGIN IMMEDIATE), so a smaller batch
# keeps its run short; the assertions are the same.
DRAIN = {"default": 2000, "mariadb": 2000, "sqlite": 600}


@pytest.mark.parametrize("alias", VENDORS)
def test_claim_heartbeat_complete_release_reclaim(alias: str) -> None:
    jobs = Job.objects.using(alias).bulk_create([Job(name=f"j{i}") for i in range(3)])
    pending = Job.objects.using(alias).filter(state="pending")
    first = claim_next(pending, worker="w1", lease=30, limit=2, set={"state": "running"})
    assert [c.pk for c in first] == [jobs[0].pk, jobs[1].pk]
    assert [(c.token, c.attempt, c.worker, c.alias) for c in first] == [(1, 1, "w1", alias)] * 2
    assert first[0].lease_expires_at.tzinfo is not None
    assert abs((first[0].lease_expires_at - db_now(alias)).total_seconds() - 30) < 5  # the database clock
    renewed = heartbeat(first[0], lease=60)
    assert renewed.lease_expires_at > first[0].lease_expires_at
    complete(renewed, set={"state": "done"})
    with pytest.raises(StaleClaim):
        complete(first[0], set={"state": "again"})
    with pytest.raises(StaleClaim):  # the worker fence: another worker's name, the right token
        release(Claim(**{**first[1].__dict__, "worker": "W1"}))
    release(first[1], set={"state": "pending"})
    again = claim(Job.objects.using(alias).filter(pk=jobs[1].pk), worker="w2", lease=30)
    assert again is not None
    assert (again.token, again.attempt) == (2, 2)
    assert claim(Job.objects.using(alias).filter(pk=jobs[1].pk), worker="w3", lease=30) is None
    expire(alias, again.pk)
    assert reclaim_expired(Job.objects.using(alias), set={"state": "pending"}) == 1
    with pytest.raises(StaleClaim):
        heartbeat(again)
    rows = {j.pk: (j.state, j.claim_token, j.lease_expires_at) for j in Job.objects.using(alias)}
    assert rows == {
        jobs[0].pk: ("done", 1, None),
        jobs[1].pk: ("pending", 2, None),
        jobs[2].pk: ("pending", 0, None),
    }


@pytest.mark.parametrize("alias", VENDORS)
def test_eight_workers_drain_the_jobs_each_completed_exactly_once(alias: str) -> None:
    total, workers, limit = DRAIN[alias], 8, 10
    Job.objects.using(alias).bulk_create([Job(name=f"job-{i}") for i in range(total)])
    pending = Job.objects.using(alias).filter(state="pending")

    # The side effect and the completion commit together, re-run whole after a deadlock (InnoDB can pick a
    # completion as the victim of a concurrent claim's next-key locks).
    @locked_operation(using=alias)
    def finish(claims: list[Claim], worker: str) -> None:
        JobLog.objects.using(alias).bulk_create(
            [JobLog(job_id=c.pk, worker=worker, token=c.token) for c in claims]
        )
        complete_many(claims, set={"state": "done"})

    def work(i: int) -> tuple[int, int]:
        done = busy = 0
        while True:
            try:
                claims = claim_next(pending, worker=f"w{i}", lease=60, limit=limit, set={"state": "running"})
            except LockTimeout:  # SQLite: the database write lock was busy past the lock timeout; try again
                busy += 1
                continue
            if not claims:
                return done, busy
            assert len(claims) <= limit
            finish(claims, f"w{i}")
            done += len(claims)

    started = time.monotonic()
    outcomes = run_concurrently(work, workers, args=[(i,) for i in range(workers)], timeout=300)
    elapsed = time.monotonic() - started
    assert [o.error for o in outcomes] == [None] * workers
    done = [o.result[0] if o.result else 0 for o in outcomes]
    busy = [o.result[1] if o.result else 0 for o in outcomes]
    if alias != "sqlite":
        assert busy == [0] * workers  # row locks: claim_next never waits for another worker's rows
    assert sum(done) == total
    if alias != "sqlite":
        # Row locks let the workers claim side by side. SQLite serialises its writers (BEGIN IMMEDIATE): under load
        # one worker may drain every job while the others wait for the write lock, which the design allows.
        assert sum(1 for n in done if n) >= 2, done  # the work really was shared
    logged = Counter(JobLog.objects.using(alias).values_list("job_id", flat=True))
    assert set(logged) == set(Job.objects.using(alias).values_list("pk", flat=True))
    assert set(logged.values()) == {1}
    assert Counter(Job.objects.using(alias).values_list("state", "claim_token", "attempts")) == Counter(
        {("done", 1, 1): total}
    )
    print(f"\n{alias}: {total} jobs by {workers} workers in {elapsed:.2f}s, per worker {done}, busy {busy}")


@pytest.mark.parametrize("alias", VENDORS)
def test_concurrent_claims_of_one_row_give_exactly_one_winner(alias: str) -> None:
    """Callers released together at a barrier, no holder: exactly one claims the row (three rounds)."""
    callers = 8
    for _ in range(3):
        job = Job.objects.using(alias).create(name="contested")
        outcomes = run_concurrently(
            lambda i, job=job: claim(job, worker=f"c{i}", lease=30, set={"state": "running"}),
            callers,
            args=[(i,) for i in range(callers)],
            timeout=60,
        )
        assert [o.error for o in outcomes] == [None] * callers
        winners = [o.result for o in outcomes if o.result is not None]
        assert len(winners) == 1
        row = Job.objects.using(alias).get(pk=job.pk)
        assert (row.claim_token, row.attempts, row.claimed_by, row.state) == (
            1,
            1,
            winners[0].worker,
            "running",
        )


@pytest.mark.parametrize("alias", vendor_params())
@override_settings(LOCKKIT={"LOCK_TIMEOUT": 30})
def test_claimers_queued_behind_a_held_row_give_exactly_one_winner(alias: str) -> None:
    """The callers really wait for the row (the database shows them blocked), then exactly one claims it.

    PostgreSQL and MariaDB: SQLite has no row lock another session could hold. The first caller waits for the
    holder; on PostgreSQL the others queue behind it for the row (their blocking pid is the first caller's, not the
    holder's): ``wait_until_blocked`` counts both.
    """
    job = Job.objects.using(alias).create(name="contested")
    callers = 6
    with hold_lock(Job.objects.using(alias).filter(pk=job.pk)) as holder:
        contending = in_thread(
            run_concurrently,
            lambda i: claim(job, worker=f"c{i}", lease=30, set={"state": "running"}),
            callers,
            args=[(i,) for i in range(callers)],
            timeout=60,
        )
        assert len(wait_until_blocked(holder, count=callers, using=alias, timeout=20)) >= callers
    outcomes = contending.result(timeout=60)
    assert [o.error for o in outcomes] == [None] * callers
    winners = [o.result for o in outcomes if o.result is not None]
    assert len(winners) == 1
    row = Job.objects.using(alias).get(pk=job.pk)
    assert (row.claim_token, row.attempts, row.claimed_by, row.state) == (1, 1, winners[0].worker, "running")


# Nested loops with re-scans: the PostgreSQL plans under which "UPDATE ... WHERE id IN (SELECT ... LIMIT n FOR
# UPDATE SKIP LOCKED)" re-evaluates its subquery and updates more than n rows.
_OVER_CLAIMING_PLANS = {
    "postgresql": "SET enable_hashjoin = off; SET enable_mergejoin = off; SET enable_material = off"
}


@pytest.mark.parametrize("alias", VENDORS)
def test_concurrent_claim_next_never_exceeds_limit_nor_claims_a_row_twice(alias: str) -> None:
    total = 200
    Job.objects.using(alias).bulk_create([Job(name=f"job-{i}") for i in range(total)])
    pending = Job.objects.using(alias).filter(state="pending")
    # 6 callers x 8 rounds x 7 = 336 asked for, 200 there: full batches first, then the last calls come up short.
    limit, callers, rounds = 7, 6, 8

    def claim_rounds(i: int) -> list[list[Any]]:
        connection = connections[alias]
        if (plans := _OVER_CLAIMING_PLANS.get(connection.vendor)) is not None:
            with connection.cursor() as cursor:
                cursor.execute(plans)
        return [
            [c.pk for c in claim_next(pending, worker=f"c{i}-{r}", lease=30, limit=limit, order_by=["-pk"])]
            for r in range(rounds)
        ]

    outcomes = run_concurrently(claim_rounds, callers, args=[(i,) for i in range(callers)], timeout=120)
    assert [o.error for o in outcomes] == [None] * callers
    batches = [batch for o in outcomes for batch in (o.result or [])]
    assert max(len(batch) for batch in batches) == limit
    claimed = [pk for batch in batches for pk in batch]
    assert len(claimed) == len(set(claimed)) == total  # every row claimed, none twice
    # Each call has a worker name of its own: no call marked more rows than its limit.
    marked = Counter(Job.objects.using(alias).values_list("claimed_by", flat=True))
    assert max(marked.values()) <= limit
    assert sum(marked.values()) == total
    assert Job.objects.using(alias).filter(claim_token=1).count() == total
    assert Job.objects.using(alias).exclude(claim_token=1).count() == 0


# -- fenced effects ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alias", VENDORS)
@pytest.mark.parametrize("mode", ["fenced", "unfenced"])
def test_leases_expiring_mid_effect_apply_fenced_effects_exactly_once(alias: str, mode: str) -> None:
    """A slow worker's leases run out while it computes; the reaper hands half its jobs back and a fast worker
    does them. Fenced, the slow worker's late effects are refused (StaleClaim, nothing written); unfenced (the
    effect commits before the fenced ``complete()``), they are applied a second time: the control that shows the
    test can fail."""
    n = 20
    jobs = Job.objects.using(alias).bulk_create([Job(name=f"job-{i}") for i in range(n)])
    pending = Job.objects.using(alias).filter(state="pending")

    def apply(c: Claim) -> None:
        if mode == "fenced":
            with fenced(c) as scope:
                JobEffect.objects.using(scope.alias).create(job_id=c.pk, worker=c.worker, token=c.token)
                complete(c, set={"state": "done"})
        else:
            JobEffect.objects.using(alias).create(job_id=c.pk, worker=c.worker, token=c.token)
            complete(c, set={"state": "done"})

    slow_claims = claim_next(pending, worker="slow", lease=30, limit=n, set={"state": "running"})
    computing, resume = threading.Event(), threading.Event()

    def slow_worker() -> Counter[str]:
        computing.set()
        assert resume.wait(60)  # mid-effect: the leases run out while the worker computes
        outcomes: Counter[str] = Counter()
        for c in slow_claims:
            try:
                apply(c)
            except StaleClaim:
                outcomes["stale"] += 1
            else:
                outcomes["done"] += 1
        return outcomes

    slow = in_thread(slow_worker)
    assert computing.wait(30)
    stolen = sorted(c.pk for c in slow_claims[::2])
    expire(alias, *stolen)
    assert reclaim_expired(Job.objects.using(alias), set={"state": "pending"}) == len(stolen)
    fast_claims = claim_next(pending, worker="fast", lease=30, limit=n, set={"state": "running"})
    assert sorted(c.pk for c in fast_claims) == stolen
    for c in fast_claims:
        apply(c)
    resume.set()
    slow_outcomes = slow.result(timeout=60)

    assert slow_outcomes == Counter({"stale": len(stolen), "done": n - len(stolen)})
    effects = Counter(JobEffect.objects.using(alias).values_list("job_id", flat=True))
    assert set(effects) == {j.pk for j in jobs}
    twice = sorted(pk for pk, count in effects.items() if count > 1)
    if mode == "fenced":
        assert twice == []
        assert set(
            JobEffect.objects.using(alias).filter(job_id__in=stolen).values_list("worker", flat=True)
        ) == {"fast"}
    else:
        assert twice == stolen  # the slow worker's effects were applied again, then its completion refused
    assert Counter(Job.objects.using(alias).values_list("state", flat=True)) == Counter({"done": n})


@pytest.mark.parametrize("alias", VENDORS)
def test_fenced_refuses_a_stale_or_expired_claim_before_the_block_runs(alias: str) -> None:
    job = Job.objects.using(alias).create(name="j")
    current = claim(job, worker="w", lease=30)
    assert current is not None
    ran: list[str] = []
    expire(alias, job.pk)  # expired by the database clock, not reclaimed yet
    with pytest.raises(StaleClaim, match="lease expired"):
        with fenced(current):
            ran.append("expired")
    reclaim_expired(Job.objects.using(alias))
    newer = claim(job, worker="w2", lease=30)
    assert newer is not None
    with pytest.raises(StaleClaim, match="token 2"):
        with fenced(current):
            ran.append("stale")
    assert ran == []
    with fenced(newer) as scope:
        assert scope.alias == alias
        JobEffect.objects.using(alias).create(job_id=job.pk, worker="w2", token=newer.token)
        complete(newer, set={"state": "done"})
    with pytest.raises(StaleClaim, match="completed or released"):
        with fenced(newer):
            ran.append("completed")
    assert ran == []
    assert JobEffect.objects.using(alias).count() == 1
    assert Job.objects.using(alias).get(pk=job.pk).state == "done"


@pytest.mark.parametrize("alias", VENDORS)
def test_an_error_in_the_fenced_block_writes_nothing(alias: str) -> None:
    job = Job.objects.using(alias).create(name="j")
    current = claim(job, worker="w", lease=30)
    assert current is not None
    with pytest.raises(RuntimeError, match="effect failed"):
        with fenced(current):
            JobEffect.objects.using(alias).create(job_id=job.pk, worker="w", token=current.token)
            complete(current, set={"state": "done"})
            raise RuntimeError("effect failed")
    assert JobEffect.objects.using(alias).count() == 0
    row = Job.objects.using(alias).get(pk=job.pk)
    assert (row.state, row.lease_expires_at is not None) == ("pending", True)
    complete(current)  # still the claim's: nothing of the failed block was committed


# -- the heartbeat runner -----------------------------------------------------------------------------------------


def _beat_connections(opened: list[Any]) -> Any:
    def record(sender: object, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread().name.startswith("lockkit-heartbeat-"):
            opened.append(connection)

    return record


@pytest.mark.parametrize("alias", VENDORS)
def test_heartbeat_runner_keeps_a_job_through_reclaims(alias: str) -> None:
    job = Job.objects.using(alias).create(name="long")
    first = claim(job, worker="w", lease=2.0)
    assert first is not None
    opened: list[Any] = []
    record = _beat_connections(opened)
    connection_created.connect(record, weak=False)
    reclaimed = []
    try:
        with heartbeat_every(first, interval=0.3) as beat:
            assert beat.interval == pytest.approx(0.3)
            # A full lease of database time past the first lease's end, while a reaper runs constantly.
            end = first.lease_expires_at + timedelta(seconds=2.0)
            deadline = time.monotonic() + 20
            while db_now(alias) <= end:
                reclaimed.append(reclaim_expired(Job.objects.using(alias)))
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert not beat.lost
            renewed = beat.claim
        assert renewed is not None
        assert renewed.lease_expires_at > first.lease_expires_at
    finally:
        connection_created.disconnect(record)
    assert set(reclaimed) == {0}
    assert len(reclaimed) >= 10
    row = Job.objects.using(alias).get(pk=job.pk)
    assert (row.claim_token, row.claimed_by, row.lease_expires_at is not None) == (1, "w", True)
    complete(renewed)
    assert opened, "the runner used no connection of its own"
    assert [wrapper.connection for wrapper in opened] == [None] * len(opened)  # none left open


@pytest.mark.parametrize("alias", VENDORS)
def test_heartbeat_runner_reports_a_stolen_claim_within_one_interval(alias: str) -> None:
    job = Job.objects.using(alias).create(name="stolen")
    first = claim(job, worker="w", lease=30)
    assert first is not None
    interval = 0.5
    with pytest.raises(StaleClaim, match="lost"):
        with heartbeat_every(first, interval=interval) as beat:
            expire(alias, job.pk)
            assert reclaim_expired(Job.objects.using(alias)) == 1
            thief = claim(job, worker="thief", lease=30)
            assert thief is not None
            stolen_at = time.monotonic()
            while job.pk not in beat.lost:
                assert time.monotonic() - stolen_at < interval + 2.0, "the stolen claim was not reported"
                threading.Event().wait(0.01)
            noticed = time.monotonic() - stolen_at
            assert not beat.holds(first)
            assert not connections[alias].in_atomic_block
    # One interval, plus the time one renewal statement takes.
    assert noticed < interval + 0.5, noticed
    row = Job.objects.using(alias).get(pk=job.pk)
    assert (row.claim_token, row.claimed_by) == (2, "thief")


def test_heartbeat_runner_refuses_an_interval_not_shorter_than_the_lease() -> None:
    job_claim = Claim(
        model=Job,
        pk=1,
        token=1,
        worker="w",
        lease_expires_at=timezone.now(),
        attempt=1,
        alias="default",
        lease=1.0,
    )
    with pytest.raises(ValueError, match="interval must be shorter than the lease"):
        heartbeat_every(job_claim, interval=1)
    with pytest.raises(TypeError, match="interval"):
        heartbeat_every(job_claim, interval="1")  # type: ignore[arg-type]
    assert heartbeat_every(job_claim).interval == pytest.approx(1 / 3)


# -- the reaper command -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alias", VENDORS)
def test_reaper_command_hands_back_expired_claims_and_respects_max_attempts(alias: str) -> None:
    jobs = Job.objects.using(alias).bulk_create(
        [Job(name=n) for n in ("expired", "exhausted", "live", "free")]
    )
    expired, exhausted, _, _ = jobs
    claims = {j.name: claim(j, worker="w", lease=60, set={"state": "running"}) for j in jobs[:3]}
    Job.objects.using(alias).filter(pk=exhausted.pk).update(attempts=3)  # its third claim
    expire(alias, expired.pk, exhausted.pk)
    out = StringIO()
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
        "--exhausted-set",
        "result=gave up",
        stdout=out,
    )
    assert out.getvalue().splitlines() == [
        f"lockkit_tests.Job: handed back 1 expired claim(s): pk {expired.pk}",
        f"lockkit_tests.Job: exhausted 1 expired claim(s): pk {exhausted.pk}",
    ]
    rows = {j.name: (j.state, j.result, j.lease_expires_at is None) for j in Job.objects.using(alias)}
    assert rows == {
        "expired": ("pending", "", True),
        "exhausted": ("failed", "gave up", True),
        "live": ("running", "", False),
        "free": ("pending", "", True),
    }
    with pytest.raises(StaleClaim):
        complete(claims["expired"])  # type: ignore[arg-type]
    complete(claims["live"])  # type: ignore[arg-type]
    out = StringIO()
    call_command("lockkit_reclaim", "lockkit_tests.Job", "--database", alias, stdout=out)
    assert out.getvalue() == "lockkit_tests.Job: no expired claims\n"
    assert claim(expired, worker="w2", lease=60) is not None  # handed back: free again


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["lockkit_tests.Nope"], "unknown model"),
        (["lockkit_tests.NotClaimable"], "does not use the lockkit.claims.Claimable mixin"),
        (["lockkit_tests.Job", "--max-attempts", "3"], "must be given together"),
        (["lockkit_tests.Job", "--max-attempts", "0", "--exhausted-set", "state=x"], "at least 1"),
        (["lockkit_tests.Job", "--set", "state"], "FIELD=VALUE"),
        (["lockkit_tests.Job", "--set", "nope=1"], "has no field 'nope'"),
        (["lockkit_tests.Job", "--set", "attempts=1"], "claim field"),
        (["lockkit_tests.Job", "--every", "0"], "--every"),
    ],
)
def test_reaper_command_refuses_bad_arguments_before_any_write(argv: list[str], message: str) -> None:
    job = Job.objects.create(name="j")
    assert claim(job, worker="w", lease=60) is not None
    expire("default", job.pk)
    with pytest.raises(CommandError, match=message):
        call_command("lockkit_reclaim", *argv, stdout=StringIO())
    assert Job.objects.get(pk=job.pk).lease_expires_at is not None


@pytest.mark.django_db(transaction=True)
def test_reaper_command_with_every_keeps_handing_back_until_stopped() -> None:
    from lockkit.management.commands.lockkit_reclaim import Command

    jobs = Job.objects.bulk_create([Job(name="first"), Job(name="second")])
    out = LineBuffer()
    command = Command(stdout=out)
    looping = in_thread(
        call_command, command, "lockkit_tests.Job", "--every", "0.1", "--set", "state=pending"
    )
    try:
        for job in jobs:  # each claim expires while the loop runs; a later pass hands it back
            assert claim(job, worker="w", lease=60, set={"state": "running"}) is not None
            expire("default", job.pk)
            assert out.wait_for(f"handed back 1 expired claim(s): pk {job.pk}", timeout=20)
    finally:
        command.stopping.set()
    looping.result(timeout=20)
    assert list(Job.objects.values_list("state", "lease_expires_at")) == [("pending", None)] * 2


class LineBuffer(StringIO):
    """Command output another thread can wait on."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        with self.changed:
            written = super().write(text)
            self.changed.notify_all()
        return written

    def wait_for(self, text: str, *, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: text in self.getvalue(), timeout=timeout)
