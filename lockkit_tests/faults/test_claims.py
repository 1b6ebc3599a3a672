"""Claims under faults (issue 11, item 6): every write bounded by the lock timeout, ``held_by``, ``StaleClaim``
telling "already completed" from "reclaimed", and a worker PgBouncer dropped for idling that still finishes.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections
from django.test.utils import override_settings

import lockkit
from lockkit.claims import (
    Claim,
    StaleClaim,
    claim,
    claim_next,
    complete,
    complete_many,
    heartbeat,
    held_by,
    reclaim_expired,
    release,
    release_many,
)
from lockkit.testing import hold_lock
from lockkit_tests.models import Job, JobLog
from lockkit_tests.support.claims_helpers import expire
from lockkit_tests.support.faultkit import behind_pgbouncer

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "bouncer"])

BOUND = 0.3  # seconds: the lock timeout under test
SLACK = 3.0  # seconds a bounded call may take in all on a loaded machine (unbounded would be 30)


def _held(worker: str = "w1") -> Claim:
    (found,) = claim_next(
        Job.objects.filter(state="pending"), worker=worker, lease=30, set={"state": "running"}
    )
    return found


ROW_WRITES: list[tuple[str, Callable[[Claim], Any]]] = [
    ("heartbeat", lambda held: heartbeat(held)),
    ("complete", lambda held: complete(held, set={"state": "done"})),
    ("release", lambda held: release(held, set={"state": "pending"})),
    ("complete_many", lambda held: complete_many([held], set={"state": "done"})),
    ("release_many", lambda held: release_many([held], set={"state": "pending"})),
]


@pytest.mark.parametrize("write", [pytest.param(w, id=name) for name, w in ROW_WRITES])
def test_fenced_writes_give_up_after_the_lock_timeout_setting(write: Callable[[Claim], Any]) -> None:
    Job.objects.create(name="a")
    held = _held()
    before = dict(Job.objects.filter(pk=held.pk).values().get())
    with override_settings(LOCKKIT={"LOCK_TIMEOUT": BOUND}), hold_lock(Job.objects.filter(pk=held.pk)):
        began = time.monotonic()
        with pytest.raises(lockkit.LockTimeout) as caught:
            write(held)
        took = time.monotonic() - began
    assert caught.value.sqlstate == "55P03"
    assert BOUND <= took < SLACK
    assert dict(Job.objects.filter(pk=held.pk).values().get()) == before  # nothing written


def test_the_lock_timeout_argument_bounds_a_write() -> None:
    Job.objects.create(name="a")
    held = _held()
    with hold_lock(Job.objects.filter(pk=held.pk)):
        began = time.monotonic()
        with pytest.raises(lockkit.LockTimeout):
            complete(held, set={"state": "done"}, lock_timeout=BOUND)
        assert time.monotonic() - began < SLACK


@contextlib.contextmanager
def _table_locked() -> Iterator[None]:
    """``LOCK TABLE`` on the jobs from another session: SKIP LOCKED skips rows, never a table lock."""
    settings = connections["default"].settings_dict
    with psycopg.connect(
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        user=settings["USER"] or None,
        dbname=settings["NAME"],
    ) as blocker:
        blocker.execute(f'LOCK TABLE "{Job._meta.db_table}" IN ACCESS EXCLUSIVE MODE')
        try:
            yield
        finally:
            blocker.rollback()


SKIP_LOCKED_CALLS: list[tuple[str, Callable[[Job], Any]]] = [
    ("claim_next", lambda job: claim_next(Job.objects.all(), worker="w1", lease=30, lock_timeout=BOUND)),
    ("reclaim_expired", lambda job: reclaim_expired(Job.objects.all(), set={}, lock_timeout=BOUND)),
    ("claim", lambda job: claim(job, worker="w1", lease=30, lock_timeout=BOUND)),
]


@pytest.mark.parametrize("call", [pytest.param(c, id=name) for name, c in SKIP_LOCKED_CALLS])
def test_claiming_and_reclaiming_are_bounded_behind_a_table_lock(call: Callable[[Job], Any]) -> None:
    job = Job.objects.create(name="a")
    with _table_locked():
        began = time.monotonic()
        with pytest.raises(lockkit.LockTimeout):
            call(job)
        assert time.monotonic() - began < SLACK


def test_held_by_lists_unexpired_claims_of_one_worker() -> None:
    Job.objects.bulk_create([Job(name=n) for n in "abcd"])
    mine = [_held("w1"), _held("w1")]
    _held("w2")
    expired = _held("w1")
    expire(expired.pk)
    found = held_by(Job.objects.all(), worker="w1")
    assert sorted((c.pk, c.token, c.worker) for c in found) == sorted((c.pk, c.token, "w1") for c in mine)
    assert all(c.lease_expires_at == Job.objects.get(pk=c.pk).lease_expires_at for c in found)
    complete(found[0], set={"state": "done"})  # what held_by returns is a working claim
    assert held_by(Job.objects.filter(state="running"), worker="w1") == [c for c in found[1:]]
    with pytest.raises(TypeError, match="worker"):
        held_by(Job.objects.all(), worker=7)  # type: ignore[arg-type]


def test_stale_claim_tells_an_earlier_completion_from_a_reclaim() -> None:
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    done = _held()
    complete(done, set={"state": "done"})
    with pytest.raises(StaleClaim) as again:
        complete(done, set={"state": "done"})  # a retried complete() whose first attempt had committed
    assert again.value.already_done is True
    reclaimed = _held()
    expire(reclaimed.pk)
    assert reclaim_expired(Job.objects.filter(state="running"), set={"state": "pending"}) == 1
    taken = _held("w2")
    assert taken.pk == reclaimed.pk
    with pytest.raises(StaleClaim) as lost:
        complete(reclaimed, set={"state": "done"})
    assert lost.value.already_done is False
    assert lost.value.holders == {reclaimed.pk: ("w2", taken.token)}


# -- PgBouncer dropping an idle client ----------------------------------------------------------------------


@pytest.fixture
def bouncer_alias() -> Iterator[str]:
    with behind_pgbouncer("default", {"client_idle_timeout": "1"}) as alias:
        yield alias


def _bouncer_dropped_client(alias: str, timeout: float = 15.0) -> None:
    """Wait until PgBouncer has closed this thread's idle client connection (the driver notices on read)."""
    raw: Any = connections[alias].connection
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # A non-blocking peek on the socket: PgBouncer sends its error (08P01 "client_idle_timeout") and closes;
        # an idle client is sent nothing else.
        sock = socket.socket(fileno=raw.fileno())
        try:
            sock.setblocking(False)
            try:
                sock.recv(1, socket.MSG_PEEK)
                return
            except BlockingIOError:
                pass
        finally:
            sock.detach()
        time.sleep(0.05)
    raise AssertionError(f"PgBouncer did not drop the idle client within {timeout}s")


def test_a_worker_pgbouncer_dropped_for_idling_heartbeats_and_completes(bouncer_alias: str) -> None:
    alias = bouncer_alias
    Job.objects.create(name="a")
    (held,) = claim_next(
        Job.objects.using(alias).filter(state="pending"), worker="w1", lease=30, set={"state": "running"}
    )
    _bouncer_dropped_client(alias)  # "4 s of work" past client_idle_timeout
    held = heartbeat(held)
    _bouncer_dropped_client(alias)
    complete(held, set={"state": "done"})
    JobLog.objects.create(job_id=held.pk, worker="w1", token=held.token)
    job = Job.objects.get()
    assert (job.state, job.lease_expires_at, job.claim_token) == ("done", None, held.token)
    assert JobLog.objects.count() == 1  # ran once


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_claim_next_that_cannot_connect_is_connection_lost_and_the_next_call_works(
    through_proxy: tuple[str, Any],
) -> None:
    # Issue 23 (the Patroni test): a claim_next whose connection could not be opened (every host refused it, as
    # during a failover) raised Django's plain OperationalError, not lockkit's typed ConnectionLost.
    alias, proxy = through_proxy
    Job.objects.create(name="a")
    proxy.refuse_new = True  # every new connection is closed at once: libpq cannot open a session
    with pytest.raises(lockkit.ConnectionLost) as caught:
        claim_next(Job.objects.filter(state="pending"), worker="w1", lease=30, using=alias)
    assert not isinstance(caught.value, lockkit.CommitOutcomeUnknown)  # nothing was sent: it changed nothing
    assert caught.value.alias == alias
    assert Job.objects.get().lease_expires_at is None  # not claimed
    proxy.refuse_new = False
    (found,) = claim_next(Job.objects.filter(state="pending"), worker="w1", lease=30, using=alias)
    assert Job.objects.get().claim_token == found.token
    connections[alias].close()
