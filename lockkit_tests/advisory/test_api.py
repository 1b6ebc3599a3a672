"""Advisory locks: arguments refused before any SQL, vendor limits (shared, session, SQLite), PostgreSQL's shared and
two-key forms, advisory waits in lock inspection, and a session lock whose session was replaced."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import NotSupportedError, connections, transaction
from django.test.utils import CaptureQueriesContext

import lockkit
import lockkit.inspection
from lockkit import AdvisoryLockLost, LockNotAvailable, locked
from lockkit.advisory.keys import advisory_key
from lockkit.testing import backend_pid, in_thread, wait_until_blocked
from lockkit_tests.support.faultkit import wait_until_gone
from lockkit_tests.support.vendors import vendor_params

BOTH = vendor_params()
POSTGRESQL = pytest.mark.django_db(transaction=True, databases=["default"])


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"key": True}, TypeError, "key"),
        ({"key": 2**63}, ValueError, "key"),
        ({"key": "x", "shared": 1}, TypeError, "shared"),
        ({"key": "x", "nowait": "yes"}, TypeError, "nowait"),
        ({"key": "x", "session": None}, TypeError, "session"),
        ({"key": "x", "lock_timeout": 0}, ValueError, "lock_timeout"),
        ({"key": "x", "lock_timeout": "5"}, TypeError, "lock_timeout"),
        ({"key": "x", "lock_timeout": True}, TypeError, "lock_timeout"),
        ({"key": "x", "using": "nope"}, ValueError, "nope"),
    ],
)
def test_bad_arguments_are_refused_when_the_lock_is_made(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    key = kwargs.pop("key")
    with pytest.raises(error, match=words):
        lockkit.advisory_lock(key, **kwargs)


def test_the_decorator_refuses_what_it_cannot_hold_a_lock_around() -> None:
    async def coroutine() -> None: ...

    def generator() -> Iterator[int]:
        yield 1

    decorator = lockkit.advisory_lock("x")
    with pytest.raises(TypeError, match="async function"):
        decorator(coroutine)
    with pytest.raises(TypeError, match="generator function"):
        decorator(generator)
    with pytest.raises(TypeError, match="decorates a callable"):
        decorator(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("alias", BOTH)
def test_a_bad_key_in_a_scope_runs_no_sql_and_leaves_the_scope_usable(alias: str) -> None:
    with locked(alias) as scope, CaptureQueriesContext(connections[alias]) as queries:
        for bad in (True, 1.5, "", (1, 2, 3)):
            with pytest.raises((TypeError, ValueError), match="key"):
                scope.advisory_lock(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="shared"):
            scope.advisory_lock("x", shared="no")  # type: ignore[arg-type]
        assert len(queries) == 0
        assert scope.advisory_lock("fine").key.value == advisory_key("fine").value


@pytest.mark.parametrize("alias", BOTH)
def test_outside_its_scope_advisory_lock_is_refused(alias: str) -> None:
    with locked(alias) as scope:
        pass
    with pytest.raises(lockkit.NotInLockedScope):
        scope.advisory_lock("late")


@pytest.mark.parametrize("alias", BOTH)
def test_advisory_waits_show_in_lock_inspection(alias: str) -> None:
    taken, done = threading.Event(), threading.Event()
    holder: dict[str, int] = {}

    def hold() -> None:
        with lockkit.advisory_lock(("inspect", "me"), using=alias) as held:
            assert held.pid is not None
            holder["pid"] = held.pid
            taken.set()
            assert done.wait(30)

    def wait() -> None:
        with lockkit.advisory_lock(("inspect", "me"), using=alias, lock_timeout=20):
            pass

    holding = in_thread(hold)
    assert taken.wait(30)
    try:
        waiter = in_thread(wait)
        wait_until_blocked(holder["pid"], using=alias, contenders=waiter)
        (found,) = lockkit.inspection.blocking(alias)
        assert found.blocking_pids == (holder["pid"],)
        key = advisory_key(("inspect", "me"))
        if alias == "default":
            assert (found.lock_kind, found.mode) == ("advisory", "ExclusiveLock")
            assert found.target == f"advisory key {key.value}"
        else:
            assert found.lock_kind == "user lock"
            assert found.target == key.lock_name(str(connections[alias].settings_dict["NAME"]))
            assert "GET_LOCK" in (found.waiting.query or "")
    finally:
        done.set()
    holding.result(timeout=30)
    waiter.result(timeout=30)


@pytest.mark.parametrize("alias", BOTH)
def test_a_session_lock_whose_connection_was_replaced_is_reported_lost(alias: str) -> None:
    with pytest.raises(AdvisoryLockLost, match="replaced") as caught:
        with lockkit.advisory_lock("replaced", using=alias, session=True):
            old_session = backend_pid(alias)
            connections[alias].close()  # the server drops the lock with the session
            connections[alias].ensure_connection()
    assert caught.value.alias == alias
    # The server ends the old session (and drops its lock) when it sees the disconnect, not when close() returns.
    wait_until_gone(alias, old_session)
    with lockkit.advisory_lock("replaced", using=alias, nowait=True):
        pass


@POSTGRESQL
def test_postgresql_shared_locks_share_and_exclude_exclusive_ones() -> None:
    taken, done = threading.Event(), threading.Event()

    def hold_shared() -> None:
        with lockkit.advisory_lock("readers", shared=True):
            taken.set()
            assert done.wait(30)

    holder = in_thread(hold_shared)
    assert taken.wait(30)
    try:
        with lockkit.advisory_lock("readers", shared=True, nowait=True) as held:
            assert held.shared
        with pytest.raises(LockNotAvailable):
            with lockkit.advisory_lock("readers", nowait=True):
                pytest.fail("an exclusive lock must wait for the shared holder")
    finally:
        done.set()
    holder.result(timeout=30)


@POSTGRESQL
def test_postgresql_two_key_form_is_its_own_key_space() -> None:
    with lockkit.advisory_lock((1, 2)):
        # The same 64 bits as a bigint key are another lock on PostgreSQL (pg_locks objsubid 1 vs 2).
        assert in_thread(_take_now, "default", 4294967298).result(timeout=30)
        assert not in_thread(_take_now, "default", (1, 2)).result(timeout=30)
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT classid, objid, objsubid FROM pg_locks WHERE locktype = 'advisory' "
                "AND pid = pg_backend_pid()"
            )
            assert cursor.fetchall() == [(1, 2, 2)]


def _take_now(alias: str, key: Any) -> bool:
    try:
        with lockkit.advisory_lock(key, using=alias, nowait=True):
            return True
    except LockNotAvailable:
        return False


@pytest.mark.parametrize("alias", [p for p in BOTH if p.id == "mariadb"])
def test_mariadb_has_no_shared_locks(alias: str) -> None:
    with CaptureQueriesContext(connections[alias]) as queries:
        with pytest.raises(NotSupportedError, match="shared advisory locks are not supported on mysql"):
            with lockkit.advisory_lock("x", using=alias, shared=True):
                pytest.fail("the block must not run")
        with locked(alias) as scope:
            before = len(queries)
            with pytest.raises(NotSupportedError, match="GET_LOCK locks are exclusive"):
                scope.advisory_lock("x", shared=True)
            assert len(queries) == before
    assert not connections[alias].in_atomic_block
    assert len([q for q in queries if "GET_LOCK" in q["sql"]]) == 0


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_sqlite_scopes_cover_every_key_and_refuse_session_locks() -> None:
    with lockkit.advisory_lock("any", using="sqlite") as held:
        assert (held.alias, held.pid) == ("sqlite", None)
        assert connections["sqlite"].in_atomic_block
    with locked("sqlite") as scope:
        assert scope.advisory_lock(("ns", "k")).key.pair is None
        with locked("sqlite") as nested:  # a savepoint of a transaction that holds the write lock
            nested.advisory_lock("inner")
    with pytest.raises(NotSupportedError, match="session=True advisory locks are not supported on sqlite"):
        with lockkit.advisory_lock("any", using="sqlite", session=True):
            pytest.fail("the block must not run")
    # A plain (deferred) atomic holds no lock yet: a key "held" there would exclude nobody.
    with transaction.atomic(using="sqlite"), locked("sqlite") as inside:
        with pytest.raises(NotSupportedError, match="write lock"):
            inside.advisory_lock("deferred")
