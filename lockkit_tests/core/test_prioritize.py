"""``lockkit.prioritize`` beyond django-pglock's cases: cancelling, the ``only`` filter, only the caller's own
blockers, a block that never waits, the watcher's end, the next call on the connection, and MariaDB's refusal."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import NotSupportedError, connections

import lockkit
from lockkit import LockTimeout, QueryCanceled, locked
from lockkit.testing import backend_pid, in_thread, wait_until_blocked
from lockkit_tests.models import Item
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON

pytestmark = pytest.mark.contention
POSTGRESQL = pytest.mark.django_db(transaction=True)


def watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("lockkit-prioritize")]


def client_sessions() -> int:
    """Client sessions of the test database other than this thread's."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def alive(pid: int) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return bool(cursor.fetchone()[0])


def start_holder(then: Callable[[], Any] | None = None) -> tuple[Any, dict[str, int], threading.Event]:
    """A session that locks Item's table (ACCESS EXCLUSIVE), runs ``then`` (or waits), and ends when released."""
    taken, release = threading.Event(), threading.Event()
    pid: dict[str, int] = {}

    def hold() -> None:
        try:
            with locked(lock_timeout=10, statement_timeout=None) as scope:
                scope.lock_table(Item, mode="ACCESS EXCLUSIVE")
                pid["pid"] = backend_pid()
                taken.set()
                if then is not None:
                    then()
                assert release.wait(30)
        finally:
            connections.close_all()

    call = in_thread(hold)
    assert taken.wait(30), call.outcome(timeout=5)
    return call, pid, release


def sleep_in_the_database() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_sleep(30)")


@POSTGRESQL
def test_cancel_ends_the_statement_of_a_busy_blocker_and_its_session_survives() -> None:
    holder, pid, release = start_holder(then=sleep_in_the_database)

    def prioritized() -> tuple[Any, ...]:
        try:
            with (
                locked(lock_timeout=20) as scope,
                lockkit.prioritize(after=0.2, interval=0.05, action="cancel") as p,
            ):
                scope.lock_table(Item, mode="SHARE")
            return p.signalled
        finally:
            connections.close_all()

    winner = in_thread(prioritized)
    assert wait_until_blocked(pid["pid"], contenders=winner)
    [signalled] = winner.result(timeout=30)
    assert (signalled.pid, signalled.action, signalled.sent) == (pid["pid"], "cancel", True)
    release.set()
    cancelled = holder.outcome(timeout=30).error
    assert isinstance(cancelled, QueryCanceled)
    assert "canceling statement" in str(cancelled)


@POSTGRESQL
def test_a_blocker_the_filter_leaves_out_is_never_signalled() -> None:
    holder, pid, release = start_holder()
    seen: list[int] = []

    def only(session: Any) -> bool:
        seen.append(session.pid)
        return bool(session.application_name == "a batch job")  # not the holder's

    try:
        with pytest.raises(LockTimeout):
            with (
                locked(lock_timeout=0.6) as scope,
                lockkit.prioritize(after=0, interval=0.05, only=only) as p,
            ):
                scope.lock_table(Item, mode="SHARE")
        assert p.signalled == ()
        assert set(seen) == {pid["pid"]}
        assert len(seen) >= 2  # asked at every poll while the caller waited, signalled never
        assert alive(pid["pid"])
    finally:
        release.set()
    holder.result(timeout=30)


@POSTGRESQL
def test_only_the_callers_own_blockers_are_signalled() -> None:
    holder, pid, release = start_holder()

    def someone_else() -> None:
        try:
            with locked(lock_timeout=20) as scope:
                scope.lock_table(Item, mode="SHARE")
        finally:
            connections.close_all()

    other = in_thread(someone_else)
    try:
        assert wait_until_blocked(pid["pid"], contenders=other)
        # The caller waits for nothing: another session's blocker is not its business.
        with locked(lock_timeout=2) as scope, lockkit.prioritize(after=0, interval=0.02) as p:
            scope.advisory_lock("prioritize:unrelated")
            # Nothing to wait for on the database here (nobody blocks the caller): give the watcher ~15 polls.
            time.sleep(0.3)
        assert p.signalled == ()
        assert alive(pid["pid"])
    finally:
        release.set()
    holder.result(timeout=30)
    other.result(timeout=30)


@POSTGRESQL
def test_the_watcher_stops_with_the_block_and_the_connection_is_usable_after() -> None:
    before = client_sessions()
    with lockkit.prioritize(interval=0.02) as p:
        assert p.pid == backend_pid()
        assert len(watchers()) == 1
        deadline = time.monotonic() + 10
        while client_sessions() == before and time.monotonic() < deadline:  # the watcher's own session
            time.sleep(0.01)
        assert client_sessions() == before + 1
    assert watchers() == []
    # Its connection is closed, not left to the server's idle timeout.
    deadline = time.monotonic() + 10
    while client_sessions() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client_sessions() == before
    # Outside a scope (autocommit) it worked too, and the caller's connection goes on.
    with locked() as scope:
        scope.lock_table(Item, mode="SHARE", nowait=True)
    # An error in the body stops it as well, and the body's error is what the caller sees.
    with pytest.raises(ZeroDivisionError), lockkit.prioritize(interval=0.02):
        _ = 1 / 0
    assert watchers() == []


@pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON)
@pytest.mark.django_db(transaction=True, databases=["default", "mariadb"])
def test_mariadb_refuses_prioritize_before_any_sql() -> None:
    with pytest.raises(NotSupportedError, match="PostgreSQL only"), lockkit.prioritize("mariadb"):
        pytest.fail("refused on MariaDB")
    assert connections["mariadb"].connection is None
    assert watchers() == []


@POSTGRESQL
def test_blockers_are_signalled_only_after_the_caller_has_waited_the_grace_period() -> None:
    holder, pid, release = start_holder()

    def prioritized() -> float:
        try:
            with locked(lock_timeout=20) as scope, lockkit.prioritize(after=1.0, interval=0.02):
                scope.lock_table(Item, mode="SHARE")
                return time.monotonic()
        finally:
            connections.close_all()

    winner = in_thread(prioritized)
    assert wait_until_blocked(pid["pid"], contenders=winner)
    seen_waiting = time.monotonic()
    granted = winner.result(timeout=30)
    release.set()
    assert holder.outcome(timeout=30).error is not None  # terminated
    # The wait began before it was seen (by at most one poll of wait_until_blocked and its round trip), and the
    # server measured it from its start: the holder was terminated no earlier than about 1 s into the wait.
    assert granted - seen_waiting >= 0.8, granted - seen_waiting
    assert granted - seen_waiting < 10
