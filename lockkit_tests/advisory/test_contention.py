"""Advisory locks under real contention, on PostgreSQL and MariaDB: waits, NOWAIT, timeouts, session locks (after
an exception and after SIGKILL of the holder), nesting, retries, and nothing left on a reused connection."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import OperationalError, connections

import lockkit
import lockkit.inspection
from lockkit import LockNotAvailable, LockTimeout, RetryPolicy, locked, locked_operation
from lockkit.advisory.keys import advisory_key
from lockkit.testing import backend_pid, in_thread, run_concurrently, wait_until_blocked
from lockkit_tests.models import Item
from lockkit_tests.support.advisory_worker import hold_session_lock
from lockkit_tests.support.vendors import vendor_params

pytestmark = pytest.mark.contention
BOTH = vendor_params()
MARIADB_ONLY = [param for param in vendor_params() if param.id == "mariadb"]


@contextmanager
def held_elsewhere(alias: str, key: Any, *, session: bool = False, write: str | None = None) -> Iterator[int]:
    """Hold ``key`` from another thread's session until the block exits; yield that session's id.

    With ``write``, the holder also creates an ``Item`` of that name in its transaction, before releasing.
    """
    taken, done = threading.Event(), threading.Event()
    pid: dict[str, int] = {}

    def hold() -> None:
        with lockkit.advisory_lock(key, using=alias, session=session, lock_timeout=10):
            pid["pid"] = backend_pid(alias)
            taken.set()
            assert done.wait(30), "the test never released the holder"
            if write is not None:
                Item.objects.using(alias).create(name=write)

    call = in_thread(hold)
    if not taken.wait(30):
        call.result(timeout=5)  # raises the holder's own failure
        pytest.fail("the holder did not take the lock within 30s")
    try:
        yield pid["pid"]
    finally:
        done.set()
        call.result(timeout=30)


def _free_here(alias: str, key: Any) -> bool:
    """Whether another session can take ``key`` at once (NOWAIT) right now."""

    def attempt() -> bool:
        try:
            with lockkit.advisory_lock(key, using=alias, nowait=True):
                return True
        except LockNotAvailable:
            return False

    return in_thread(attempt).result(timeout=30)


def _held_by_this_session(alias: str, key: Any) -> int:
    """How many advisory locks this thread's session holds (PostgreSQL) or whether it holds ``key`` (MariaDB)."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            )
        else:
            name = advisory_key(key).lock_name(str(connection.settings_dict["NAME"]))
            cursor.execute("SELECT IS_USED_LOCK(%s) <=> CONNECTION_ID()", [name])
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("alias", BOTH)
def test_the_second_session_waits_then_sees_the_first_commit(alias: str) -> None:
    def second() -> list[str]:
        with lockkit.advisory_lock("report:2026-11", using=alias, lock_timeout=20):
            return list(Item.objects.using(alias).values_list("name", flat=True))

    with held_elsewhere(alias, "report:2026-11", write="by the first") as holder:
        contender = in_thread(second)
        assert wait_until_blocked(holder, using=alias, contenders=contender)
        assert not contender.done()
    # The holder wrote in its transaction before releasing: the second session ran after that commit.
    assert contender.result(timeout=30) == ["by the first"]


@pytest.mark.parametrize("alias", BOTH)
def test_nowait_fails_at_once(alias: str) -> None:
    with held_elsewhere(alias, 7):
        with pytest.raises(LockNotAvailable) as caught:
            with lockkit.advisory_lock(7, using=alias, nowait=True):
                pytest.fail("the block must not run")
        with pytest.raises(LockNotAvailable), locked(alias, nowait=True) as scope:
            scope.advisory_lock(7)
        assert not connections[alias].in_atomic_block
        assert _held_by_this_session(alias, 7) == 0
    assert caught.value.alias == alias
    assert isinstance(caught.value, OperationalError)


@pytest.mark.parametrize("alias", BOTH)
def test_lock_timeout_raises_lock_timeout(alias: str) -> None:
    with held_elsewhere(alias, ("billing", 42)):
        with pytest.raises(LockTimeout) as caught:
            with lockkit.advisory_lock(("billing", 42), using=alias, lock_timeout=0.2):
                pytest.fail("the block must not run")
        with pytest.raises(LockTimeout), locked(alias, lock_timeout=0.2) as scope:
            scope.advisory_lock(("billing", 42))
        # The connection is usable and holds nothing.
        assert Item.objects.using(alias).count() == 0
        assert _held_by_this_session(alias, ("billing", 42)) == 0
    assert caught.value.alias == alias
    assert caught.value.sqlstate == ("55P03" if alias == "default" else None)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("alias", BOTH)
def test_a_session_lock_is_released_after_an_exception(alias: str, error: type[BaseException]) -> None:
    with pytest.raises(error, match="job failed"):
        with lockkit.advisory_lock("cron:cleanup", using=alias, session=True) as held:
            # The block runs outside any transaction, on the session that holds the lock.
            assert not connections[alias].in_atomic_block
            assert held.pid == backend_pid(alias)
            assert _held_by_this_session(alias, "cron:cleanup") == 1
            assert not _free_here(alias, "cron:cleanup")
            raise error("job failed")
    assert _held_by_this_session(alias, "cron:cleanup") == 0
    assert _free_here(alias, "cron:cleanup")


@pytest.mark.parametrize("alias", BOTH)
def test_a_session_lock_is_released_by_the_server_after_sigkill(alias: str) -> None:
    key = "migrate:once-across-servers"  # a str key: the child process must hash it to the same lock
    names = {name: connections[name].settings_dict["NAME"] for name in ("default", alias)}
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    worker = context.Process(target=hold_session_lock, args=(names, theirs, alias, key), daemon=True)
    worker.start()
    try:
        assert ours.poll(60), "the worker process did not take the lock within 60s"
        holder_pid = ours.recv()
        with pytest.raises(LockNotAvailable):
            with lockkit.advisory_lock(key, using=alias, nowait=True):
                pytest.fail("the killed process's lock must still be held here")
        waiter = in_thread(_take_within, alias, key, 30.0)
        wait_until_blocked(holder_pid, using=alias, contenders=waiter)
    finally:
        os.kill(worker.pid or 0, signal.SIGKILL)
        worker.join(10)
    assert worker.exitcode == -signal.SIGKILL
    # The server drops the dead session's lock: the waiter gets it without anyone releasing it.
    assert waiter.result(timeout=30) != holder_pid


def _take_within(alias: str, key: Any, limit: float) -> int:
    with lockkit.advisory_lock(key, using=alias, lock_timeout=limit) as held:
        assert held.pid is not None
        return held.pid


@pytest.mark.parametrize("alias", BOTH)
def test_nested_scopes_keep_the_lock_until_the_outer_transaction_ends(alias: str) -> None:
    with locked(alias) as outer:
        with locked(alias) as inner:
            inner.advisory_lock("nested")
        # A nested scope that succeeded leaves it to the outer transaction.
        assert not _free_here(alias, "nested")
        with pytest.raises(ValueError, match="boom"), locked(alias) as failing:
            failing.advisory_lock("rolled back")
            raise ValueError("boom")
        # A nested scope that failed gives its lock back with its savepoint.
        assert _free_here(alias, "rolled back")
        assert outer.alias == alias
    assert _free_here(alias, "nested")
    assert _held_by_this_session(alias, "nested") == 0


@pytest.mark.parametrize("alias", BOTH)
def test_locked_operation_retries_an_advisory_lock_timeout(alias: str) -> None:
    release = threading.Event()
    failures: list[str] = []

    def on_retry(event: lockkit.RetryEvent) -> None:
        failures.append(type(event.error).__name__)
        release.set()  # let the holder go after the first timeout

    @locked_operation(using=alias, lock_timeout=0.2, retry=RetryPolicy(attempts=5, before_retry=on_retry))
    def nightly() -> int:
        scope = lockkit.current_scope()
        scope.advisory_lock("nightly")
        return scope.attempt

    taken = threading.Event()

    def hold() -> None:
        with lockkit.advisory_lock("nightly", using=alias):
            taken.set()
            assert release.wait(30)

    holder = in_thread(hold)
    assert taken.wait(30)
    assert nightly() >= 2
    holder.result(timeout=30)
    assert failures[0] == "LockTimeout"


@pytest.mark.parametrize("alias", BOTH)
def test_one_decorated_function_in_two_threads_excludes_itself(alias: str) -> None:
    entered: dict[int, threading.Event] = {0: threading.Event(), 1: threading.Event()}
    go = threading.Event()
    pids: dict[int, int] = {}

    @lockkit.advisory_lock("decorated", using=alias, lock_timeout=20)
    def critical(index: int) -> int:
        pids[index] = backend_pid(alias)
        entered[index].set()
        assert go.wait(30)
        return index

    first = in_thread(critical, 0)
    assert entered[0].wait(30)
    second = in_thread(critical, 1)
    wait_until_blocked(pids[0], using=alias, contenders=second)
    assert not entered[1].is_set()  # the decorator's per-call state is not shared between the threads
    go.set()
    assert (first.result(timeout=30), second.result(timeout=30)) == (0, 1)


@pytest.mark.parametrize("alias", BOTH)
def test_no_lost_update_under_the_lock_from_six_threads(alias: str) -> None:
    counter = Item.objects.using(alias).create(name="counter", value=0)

    @lockkit.advisory_lock(("counter", counter.pk), using=alias, lock_timeout=30)
    def increment() -> None:
        # Read, then write in another statement: without the lock, concurrent increments would be lost.
        value = Item.objects.using(alias).get(pk=counter.pk).value
        Item.objects.using(alias).filter(pk=counter.pk).update(value=value + 1)

    def worker() -> int:
        for _ in range(5):
            increment()
        return 5

    outcomes = run_concurrently(worker, n=6, timeout=60)
    assert [outcome.unwrap() for outcome in outcomes] == [5] * 6
    assert Item.objects.using(alias).get(pk=counter.pk).value == 30


@pytest.mark.parametrize("alias", MARIADB_ONLY)
def test_no_get_lock_is_left_on_the_connection_after_a_failure(alias: str) -> None:
    for _ in range(2):  # the same (reused) connection, twice
        with pytest.raises(ZeroDivisionError), locked(alias) as scope:
            scope.advisory_lock("pooled")
            assert _held_by_this_session(alias, "pooled") == 1
            _ = 1 / 0
        assert connections[alias].connection is not None  # still open: a pooled connection's next user
        assert _held_by_this_session(alias, "pooled") == 0
        assert _free_here(alias, "pooled")


@pytest.mark.parametrize("alias", MARIADB_ONLY)
def test_a_killed_session_leaves_no_get_lock_behind(alias: str) -> None:
    with pytest.raises(OperationalError), locked(alias) as scope:
        held = scope.advisory_lock("killed")
        assert held.pid is not None
        lockkit.inspection.terminate(held.pid, using=alias)
        Item.objects.using(alias).count()  # the killed session fails here
    # The server dropped the lock with the session; this thread's next scope works on a new connection.
    assert _free_here(alias, "killed")
    with locked(alias) as scope:
        again = scope.advisory_lock("killed")
    assert again.pid != held.pid
    assert _held_by_this_session(alias, "killed") == 0


@pytest.mark.parametrize("alias", BOTH)
def test_a_session_lock_already_on_this_server_session_is_refused_and_nothing_is_taken(alias: str) -> None:
    """What a transaction pooler does (lockkit_tests/topology/test_pooled_advisory.py): the server session this client
    got already holds the key for another client (here: raw SQL on it, not a block of lockkit's)."""
    connection = connections[alias]
    key = advisory_key("cron:left-here")
    name = key.lock_name(str(connection.settings_dict["NAME"]))
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_advisory_lock(%s)", [key.value])
        else:
            cursor.execute("SELECT GET_LOCK(%s, 0)", [name])
    try:
        with pytest.raises(lockkit.AdvisoryLockAlreadyHeld, match="already holds it"):
            with lockkit.advisory_lock("cron:left-here", using=alias, session=True, nowait=True):
                pytest.fail("a session lock that excludes nobody was granted")
        with connection.cursor() as cursor:  # one hold only: the refusal took none
            if connection.vendor == "postgresql":
                cursor.execute(
                    "SELECT pg_advisory_unlock(%s), pg_advisory_unlock(%s)", [key.value, key.value]
                )
            else:
                cursor.execute("SELECT RELEASE_LOCK(%s), RELEASE_LOCK(%s)", [name, name])
            assert [bool(v) for v in cursor.fetchone()] == [True, False]  # MariaDB: NULL, no such lock
        assert _free_here(alias, "cron:left-here")
        with lockkit.advisory_lock(
            "cron:left-here", using=alias, session=True, nowait=True
        ) as held:  # next call
            assert held.pid == backend_pid(alias)
    finally:
        connection.close()
