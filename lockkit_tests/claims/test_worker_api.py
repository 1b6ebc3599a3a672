"""claim_next(expired=True), heartbeat_held() and heartbeat_every(queryset, worker=...): a worker's own loop."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from lockkit import AliasMismatch
from lockkit.claims import (
    StaleClaim,
    claim_next,
    complete,
    heartbeat,
    heartbeat_every,
    heartbeat_held,
    heartbeats,
    release,
)
from lockkit.errors import LockTimeout
from lockkit.testing import hold_lock, in_thread, wait_until_blocked
from lockkit_harness.proxy import FaultProxy
from lockkit_tests.models import Job
from lockkit_tests.support.claim_worker import claim_and_beat
from lockkit_tests.support.claims_vendors import claims_vendor_params, db_now, expire, wait_for_clock
from lockkit_tests.support.vendors import vendor_params

VENDORS = claims_vendor_params()


def _jobs(alias: str, n: int) -> list[Any]:
    return [job.pk for job in Job.objects.using(alias).bulk_create([Job(name=f"j{i}") for i in range(n)])]


def _row(alias: str, pk: Any) -> Any:
    return Job.objects.using(alias).values("claim_token", "claimed_by", "attempts", "state").get(pk=pk)


# -- claim_next(expired=True) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("alias", VENDORS)
@pytest.mark.parametrize("limit", [1, 3], ids=["one", "many"])
def test_expired_claims_are_claimable_with_a_new_token_and_attempt(alias: str, limit: int) -> None:
    pks = _jobs(alias, 3)
    jobs = Job.objects.using(alias)
    old = claim_next(jobs, worker="dead", lease=30, limit=3)
    assert [c.pk for c in old] == pks
    expire(alias, pks[0], pks[2])
    # Without expired=, nothing is free: the expired rows wait for a reaper.
    assert claim_next(jobs, worker="new", lease=30, limit=limit) == []
    with CaptureQueriesContext(connections[alias]) as queries:
        taken = claim_next(jobs, worker="new", lease=30, limit=limit, expired=True, set={"state": "running"})
    if alias == "default":  # one message: its opening, the claiming statement and COMMIT, in one round trip
        (sent,) = [q["sql"] for q in queries]
        assert sent.startswith("BEGIN"), sent
        assert sent.endswith("; COMMIT"), sent
        assert "statement_timestamp()" in sent
    expected = [pks[0], pks[2]][:limit]
    assert [c.pk for c in taken] == expected
    for claim in taken:
        assert (claim.token, claim.attempt, claim.worker) == (2, 2, "new")
        assert _row(alias, claim.pk) == {
            "claim_token": 2,
            "claimed_by": "new",
            "attempts": 2,
            "state": "running",
        }
    # The previous holder's claim is stale; the unexpired one (pks[1]) was left alone.
    with pytest.raises(StaleClaim):
        complete(old[0], set={"state": "done"})
    with pytest.raises(StaleClaim):
        heartbeat(old[0])
    assert _row(alias, pks[1])["claimed_by"] == "dead"
    heartbeat(old[1])  # still its holder's


@pytest.mark.parametrize("alias", VENDORS)
def test_expired_and_free_rows_are_claimed_in_one_order(alias: str) -> None:
    pks = _jobs(alias, 4)
    jobs = Job.objects.using(alias)
    (a,) = claim_next(jobs.filter(pk=pks[1]), worker="dead", lease=30)
    (b,) = claim_next(jobs.filter(pk=pks[3]), worker="dead", lease=30)
    claim_next(jobs.filter(pk=pks[2]), worker="live", lease=30)  # unexpired: never taken
    expire(alias, a.pk, b.pk)
    taken = claim_next(jobs, worker="new", lease=30, limit=10, expired=True, order_by=["-pk"])
    assert [c.pk for c in taken] == [pks[3], pks[1], pks[0]]
    assert [c.attempt for c in taken] == [2, 2, 1]


@pytest.mark.parametrize("alias", vendor_params())
def test_an_expired_row_held_by_another_session_is_skipped(alias: str) -> None:
    pks = _jobs(alias, 3)
    jobs = Job.objects.using(alias)
    claim_next(jobs, worker="dead", lease=30, limit=3)
    expire(alias, *pks)
    started, release_it = threading.Event(), threading.Event()

    def hold() -> list[Any]:
        from django.db import transaction

        with transaction.atomic(using=alias):
            got = claim_next(jobs, worker="slow", lease=30, expired=True, order_by=["name"])  # holds pks[0]
            started.set()
            assert release_it.wait(10)
        return got

    holder = in_thread(hold)
    assert started.wait(10)
    try:
        # Ordered by a column no index covers: MariaDB must still skip only the row in flight.
        others = claim_next(jobs, worker="fast", lease=30, expired=True, limit=2, order_by=["name"])
    finally:
        release_it.set()
    (held,) = holder.result(timeout=10)
    assert (held.pk, [c.pk for c in others]) == (pks[0], pks[1:])
    assert [c.attempt for c in others] == [2, 2]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_expired_must_be_a_bool(value: Any) -> None:
    with CaptureQueriesContext(connections["default"]) as queries:
        with pytest.raises(TypeError, match="expired"):
            claim_next(Job.objects.all(), worker="w", lease=30, expired=value)
    assert len(queries) == 0


# -- heartbeat_held ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alias", VENDORS)
def test_heartbeat_held_renews_every_held_claim_and_reports_the_rest_lost(alias: str) -> None:
    pks = _jobs(alias, 5)
    jobs = Job.objects.using(alias)
    mine = claim_next(jobs, worker="w1", lease=5, limit=4)
    claim_next(jobs, worker="w2", lease=5)  # pks[4]: another worker's
    expire(alias, mine[1].pk)  # lapsed: never renewed
    (stolen,) = claim_next(jobs.filter(pk=mine[1].pk), worker="w3", lease=30, expired=True)
    complete(mine[2])  # ended by its worker: not held
    before = db_now(alias)
    with CaptureQueriesContext(connections[alias]) as queries:
        held = heartbeat_held(jobs, worker="w1", lease=60)
    assert held == {mine[0].pk: mine[0].token, mine[3].pk: mine[3].token}
    if alias == "default":
        assert len(queries) == 1  # one statement (one message with its BEGIN and COMMIT)
    rows: dict[Any, Any] = {r["pk"]: r for r in jobs.values("pk", "lease_expires_at", "claim_token")}
    for pk in held:
        assert rows[pk]["lease_expires_at"] >= before + timedelta(seconds=59)
    assert rows[stolen.pk]["claim_token"] == stolen.token
    complete(mine[0])  # the tokens are unchanged: the claims still work
    assert heartbeat_held(jobs.filter(pk__in=[pks[0], pks[1]]), worker="w1", lease=60) == {}
    assert heartbeat_held(jobs.none(), worker="w1", lease=60) == {}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"worker": "", "lease": 5}, ValueError, "worker"),
        ({"worker": 3, "lease": 5}, TypeError, "worker"),
        ({"worker": "w", "lease": 0}, ValueError, "lease"),
        ({"worker": "w", "lease": True}, TypeError, "lease"),
        ({"worker": "a\x00b", "lease": 5}, ValueError, "worker"),
        ({"worker": "w" * 256, "lease": 5}, ValueError, "worker"),
        ({"worker": "w", "lease": float("inf")}, ValueError, "lease"),
        ({"worker": "w", "lease": "5"}, TypeError, "lease"),
    ],
)
def test_heartbeat_held_refuses_bad_arguments_before_sql(kwargs: Any, error: Any, match: str) -> None:
    with CaptureQueriesContext(connections["default"]) as queries:
        with pytest.raises(error, match=match):
            heartbeat_held(Job, **kwargs)
        with pytest.raises(TypeError, match="model_or_queryset"):
            heartbeat_held(object(), worker="w", lease=5)
        with pytest.raises(ValueError, match="model_or_queryset must not be sliced"):
            heartbeat_held(Job.objects.all()[:3], worker="w", lease=5)
        with pytest.raises(TypeError, match="interval"):
            heartbeat_every(Job, worker="w", lease=5, interval=True)
        with pytest.raises(TypeError, match="claim"):
            heartbeat_every(Job, worker="w", lease=5, interval=1).holds("not a claim")  # type: ignore[arg-type]
    assert len(queries) == 0


# -- heartbeat_every(queryset, worker=...) -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lease": 5, "interval": 5}, "interval must be shorter"),
        ({"lease": 5, "interval": 0}, "interval"),
        ({"lease": 5, "interval": -1}, "interval"),
        ({"lease": 0, "interval": 1}, "lease"),
        ({"lease": 5, "interval": float("nan")}, "interval"),
    ],
)
def test_heartbeat_every_validates_before_sql(kwargs: Any, match: str) -> None:
    with CaptureQueriesContext(connections["default"]) as queries:
        with pytest.raises(ValueError, match=match):
            heartbeat_every(Job, worker="w", **kwargs)
    assert len(queries) == 0


@pytest.mark.django_db(transaction=True)
def test_heartbeat_every_needs_a_worker_and_lease_with_a_queryset_and_neither_with_a_claim() -> None:
    (made,) = claim_next(Job.objects.filter(pk__in=_jobs("default", 1)), worker="w", lease=6)
    with CaptureQueriesContext(connections["default"]) as queries:
        with pytest.raises(TypeError, match="worker and lease are required with a queryset"):
            heartbeat_every(Job, lease=5)
        with pytest.raises(TypeError, match="worker and lease are required with a queryset"):
            heartbeat_every(Job, worker="w")
        with pytest.raises(TypeError, match="worker and using are for a queryset"):
            heartbeat_every(made, worker="w")
        with pytest.raises(TypeError, match="worker and using are for a queryset"):
            heartbeat_every(made, using="default")
        with pytest.raises(TypeError, match="target"):
            heartbeat_every(object(), worker="w", lease=5)
        assert heartbeat_every(Job, worker="w", lease=6).interval == pytest.approx(2)  # a third of the lease
        one = heartbeat_every(made)
        assert one.interval == pytest.approx(2)
        assert (one.lease, one.worker, one.claim, one.held) == (6, "w", made, {made.pk: made.token})
    assert len(queries) == 0


@pytest.mark.parametrize("alias", VENDORS)
def test_heartbeat_every_keeps_the_claims_and_tells_which_were_lost(alias: str) -> None:
    jobs = Job.objects.using(alias)
    pks = _jobs(alias, 3)
    claims = claim_next(jobs, worker="w1", lease=1, limit=3)
    with heartbeat_every(jobs, worker="w1", lease=1, interval=0.2) as beat:
        assert beat.wait_for_beat(10)
        assert all(beat.holds(c) for c in claims)
        complete(claims[0])  # ended by the worker: not lost
        # Another session takes claims[1]'s row: the beat cannot renew it any more.
        expire(alias, claims[1].pk)
        (thief,) = claim_next(jobs.filter(pk=claims[1].pk), worker="w2", lease=30, expired=True)
        first = beat.last_beat
        assert first is not None
        deadline = db_now(alias) + timedelta(seconds=10)
        while beat.last_beat == first or claims[1].pk not in beat.lost:
            assert db_now(alias) < deadline
            threading.Event().wait(0.05)
        assert beat.lost == {claims[1].pk}
        assert not beat.holds(claims[1])
        assert not beat.holds(claims[0])  # completed: no longer held (and not lost)
        assert beat.holds(claims[2])
        # Past the original lease, the remaining claim is still held thanks to the beats.
        threading.Event().wait(1.2)
        heartbeat(claims[2])  # live: not StaleClaim
        # A claim made after the latest beat is held until a beat says otherwise.
        release(claims[2])
        (again,) = claim_next(jobs.filter(pk=pks[2]), worker="w1", lease=1)
        assert beat.holds(again)
        # Two beats later: the first may have started before the claim committed (and not see it), the second not.
        for _ in range(2):
            seen = beat.last_beat
            while beat.last_beat == seen:
                assert db_now(alias) < deadline
                threading.Event().wait(0.05)
        assert beat.held.get(again.pk) == again.token == 2
        assert beat.holds(again)
        assert not beat.holds(claims[2])  # the beat renewed a newer claim of that row
        assert beat.lost == {claims[1].pk}
    assert beat.error is None
    assert thief.worker == "w2"


@pytest.mark.parametrize("alias", VENDORS)
def test_heartbeat_every_keeps_only_the_latest_lost_claims(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lost`` keeps the latest ``LOST_KEPT``: a heartbeat that lasts a worker's life does not grow for ever."""
    monkeypatch.setattr(heartbeats, "LOST_KEPT", 2)
    jobs = Job.objects.using(alias)
    _jobs(alias, 3)
    claims = claim_next(jobs, worker="w1", lease=1, limit=3, order_by=["pk"])
    deadline = db_now(alias) + timedelta(seconds=20)
    with heartbeat_every(jobs, worker="w1", lease=1, interval=0.2) as beat:
        assert beat.wait_for_beat(10)
        for claim in claims:  # taken by another worker one at a time: each is lost at a beat of its own
            expire(alias, claim.pk)
            claim_next(jobs.filter(pk=claim.pk), worker="w2", lease=30, expired=True)
            while claim.pk not in beat.lost:
                assert db_now(alias) < deadline
                threading.Event().wait(0.05)
        assert beat.lost == {claims[1].pk, claims[2].pk}  # the oldest loss was forgotten
    assert beat.error is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("form", ["queryset", "claim"])
def test_heartbeat_every_raises_on_exit_when_the_latest_beat_failed(form: str) -> None:
    jobs = Job.objects.all()
    _jobs("default", 1)
    (made,) = claim_next(jobs, worker="w1", lease=5)
    table = connections["default"].ops.quote_name(Job._meta.db_table)
    started = threading.Event()
    release_lock = threading.Event()

    def lock_table() -> None:
        from django.db import transaction

        with transaction.atomic(), connections["default"].cursor() as cursor:
            cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            started.set()
            assert release_lock.wait(10)

    from django.test import override_settings

    with override_settings(LOCKKIT={"LOCK_TIMEOUT": 0.2}):
        holder = in_thread(lock_table)
        assert started.wait(10)
        with pytest.raises(LockTimeout) as failed:
            beating = heartbeat_every(jobs, worker="w1", lease=5, interval=0.3)
            if form == "claim":  # the same object, renewing one claim with heartbeat()
                beating = heartbeat_every(made, interval=0.3)
            with beating as beat:
                deadline = db_now("default") + timedelta(seconds=10)
                while beat.error is None:
                    assert db_now("default") < deadline
                    threading.Event().wait(0.05)
        release_lock.set()
        holder.result(timeout=10)
    assert failed.value is beat.error
    assert beat.lost == set()  # a failed beat loses nothing: the claim is still held
    heartbeat(made)


# -- a lost reply of claim_next(expired=True) ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_a_lost_reply_of_an_expired_claim_returns_exactly_the_rows_it_claimed(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    pks = _jobs("default", 4)
    # The same worker name held all four before (a restarted slot): two expired, two still live.
    old = claim_next(Job.objects.all(), worker="w", lease=30, limit=4)
    expire("default", pks[1], pks[3])
    wait_for_clock("default", db_now("default") + timedelta(seconds=0.05))
    proxy.arm("deliver")  # the server runs the whole message, COMMIT included; its reply is cut
    claimed = claim_next(
        Job.objects.using(alias), worker="w", lease=30, limit=3, expired=True, order_by=["-pk"]
    )
    assert proxy.cuts["deliver"] == 1
    # Only the two expired rows were claimable: they are the call's claims, in the order asked, with new tokens.
    assert [(c.pk, c.token, c.attempt) for c in claimed] == [(pks[3], 2, 2), (pks[1], 2, 2)]
    for made in claimed:
        complete(made, set={"state": "done"})
    # The live claims of the earlier run were not taken for this call's, and still work.
    for earlier in (old[0], old[2]):
        heartbeat(earlier)
    with pytest.raises(StaleClaim):
        complete(old[1])


@pytest.mark.parametrize("alias", vendor_params())
def test_heartbeat_held_waits_for_a_claim_being_written_never_reports_it_lost(alias: str) -> None:
    _jobs(alias, 3)
    jobs = Job.objects.using(alias)
    mine = claim_next(jobs, worker="w1", lease=30, limit=3)
    poll = 0.15 if alias == "mariadb" else 0.005
    with hold_lock(jobs.filter(pk=mine[1].pk), timeout=20) as holder:  # e.g. the worker's own fenced() block
        beating = in_thread(heartbeat_held, jobs, worker="w1", lease=60)
        wait_until_blocked(holder, contenders=beating, poll=poll)
    assert beating.result(timeout=10) == {c.pk: c.token for c in mine}


@pytest.mark.django_db(transaction=True)
def test_heartbeat_every_is_entered_once_and_refuses_a_mismatched_alias() -> None:
    beat = heartbeat_every(Job, worker="w", lease=5, interval=1)
    with beat:
        pass
    with pytest.raises(RuntimeError, match="entered once"):
        beat.__enter__()
    with pytest.raises(AliasMismatch):
        heartbeat_every(Job.objects.using("other"), worker="w", lease=5, interval=1, using="default")
    assert beat.error is None
    assert beat.last_beat is not None  # it beat on entry
    (theirs,) = claim_next(Job.objects.filter(pk__in=_jobs("default", 1)), worker="someone else", lease=5)
    with pytest.raises(ValueError, match="claim is a claim of Job on 'default' by 'someone else'"):
        beat.holds(theirs)


# -- faults: a worker killed while its heartbeat runs; its beat connection terminated -------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_killed_workers_claims_expire_and_are_claimed_again_with_an_attempt_counted() -> None:
    pks = _jobs("default", 2)
    names = {alias: connections[alias].settings_dict["NAME"] for alias in ("default", "other")}
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    worker = context.Process(target=claim_and_beat, args=(names, theirs, 1.0, 0.2), daemon=True)
    worker.start()
    try:
        assert ours.poll(60), "the worker process did not claim and beat within 60s"
        claims, held = ours.recv()
    finally:
        os.kill(worker.pid or 0, signal.SIGKILL)
        worker.join(10)
    assert worker.exitcode == -signal.SIGKILL
    assert held == {c.pk: c.token for c in claims}
    assert sorted(held) == pks
    renewed: dict[Any, Any] = dict(Job.objects.values_list("pk", "lease_expires_at"))
    assert all(renewed[c.pk] > c.lease_expires_at for c in claims)  # the beats moved the leases
    # Nobody renews them now: once the database clock passes the last lease, a claim takes them, counted.
    wait_for_clock("default", max(renewed.values()))
    taken = claim_next(Job.objects.all(), worker="survivor", lease=30, limit=5, expired=True)
    assert [(c.pk, c.token, c.attempt) for c in taken] == [(pk, 2, 2) for pk in pks]
    with pytest.raises(StaleClaim):
        complete(claims[0])


@pytest.mark.django_db(transaction=True)
def test_a_beat_whose_connection_was_terminated_carries_on_on_a_new_one() -> None:
    (claim,) = claim_next(Job.objects.filter(pk__in=_jobs("default", 1)), worker="w1", lease=2)
    with heartbeat_every(Job, worker="w1", lease=2, interval=0.2) as beat:
        assert beat.wait_for_beat(10)
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            assert cursor.fetchall()  # the beat's session
        killed = time.monotonic()
        deadline = killed + 10
        while (beat.last_beat or 0) <= killed:  # a beat that succeeded after its session was terminated
            assert time.monotonic() < deadline, f"no beat succeeded after the termination: {beat.error}"
            threading.Event().wait(0.05)
        assert beat.holds(claim)
    assert beat.error is None
    heartbeat(claim)  # still held


# -- holds() never answers from a beat the worker slept through ------------------------------------------------


def _wait_until_stale(beat: heartbeat_every, alias: str) -> None:
    """Wait (bounded) until the latest successful beat is older than ``holds()`` trusts: the thread cannot beat."""
    from lockkit.claims.heartbeats import STALE_AFTER

    deadline = db_now(alias) + timedelta(seconds=10)
    while True:
        last = beat.last_beat
        assert last is not None
        if time.monotonic() - last > STALE_AFTER * beat.interval and beat.error is not None:
            return
        assert db_now(alias) < deadline, "the heartbeat kept beating while its rows were locked"
        threading.Event().wait(0.05)


@pytest.mark.parametrize("alias", vendor_params())
def test_holds_beats_first_when_the_latest_beat_is_too_old_and_refuses_a_claim_taken_meanwhile(
    alias: str,
) -> None:
    from django.test import override_settings

    jobs = Job.objects.using(alias)
    (pk,) = _jobs(alias, 1)
    (mine,) = claim_next(jobs, worker="w1", lease=30)
    # The beat waits at most 0.3 s for a row lock; it beats every 0.4 s, so holds() trusts a beat for 0.6 s.
    with override_settings(LOCKKIT={"LOCK_TIMEOUT": 0.3}):
        with heartbeat_every(jobs, worker="w1", lease=30, interval=0.4) as beat:
            assert beat.wait_for_beat(10)
            assert beat.holds(mine)
            # Another session takes the job (as a worker would once the lease ran out) and keeps the row locked:
            # the thread's beats wait for the lock, time out, and the latest successful beat grows old.
            with hold_lock(jobs.filter(pk=pk), timeout=30) as holder:
                holder.run(lambda: jobs.filter(pk=pk).update(claimed_by="w2", claim_token=mine.token + 1))
                _wait_until_stale(beat, alias)
                # The latest successful beat said "held"; holds() does not trust it: it beats, which cannot
                # confirm the claim (the row is locked), so the answer is False, not the stale True.
                assert beat.holds(mine) is False
                assert isinstance(beat.error, LockTimeout)
                holder.release(commit=True)
            # Now a beat can run: it finds the row claimed by w2, and holds() says so at once.
            assert beat.holds(mine) is False
            assert beat.error is None
            assert pk not in beat.held
            assert pk in beat.lost
    assert _row(alias, pk)["claimed_by"] == "w2"


@pytest.mark.parametrize("alias", vendor_params())
def test_holds_answers_true_after_a_pause_when_the_claim_survived_it(alias: str) -> None:
    from django.test import override_settings

    jobs = Job.objects.using(alias)
    (pk,) = _jobs(alias, 1)
    (mine,) = claim_next(jobs, worker="w1", lease=30)
    with override_settings(LOCKKIT={"LOCK_TIMEOUT": 0.3}):
        with heartbeat_every(jobs, worker="w1", lease=30, interval=0.4) as beat:
            assert beat.wait_for_beat(10)
            with hold_lock(jobs.filter(pk=pk), timeout=30):
                _wait_until_stale(beat, alias)
                stale_since = beat.last_beat
            # The lock is gone (rolled back, nothing changed): holds() beats on this thread and says True.
            assert beat.holds(mine) is True
            assert beat.last_beat is not None
            assert stale_since is not None
            assert beat.last_beat > stale_since
            assert beat.held == {pk: mine.token}
            assert beat.lost == set()
    heartbeat(mine)  # still this worker's claim: not StaleClaim
