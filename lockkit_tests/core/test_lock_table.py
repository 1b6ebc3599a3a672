"""``LockScope.lock_table`` beyond django-pglock's cases: every mode as the server holds it, nothing left after the
scope, nesting, hostile inputs refused before SQL, the scope's lock timeout, retries, inspection, and the
refusals of MariaDB and SQLite."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import NotSupportedError, connections, transaction
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit import AliasMismatch, LockTimeout, RetryPolicy, TableLockMode, locked, locked_operation
from lockkit.capabilities import Capabilities, capabilities, format_table
from lockkit.claims import Claimable
from lockkit.testing import backend_pid, in_thread, wait_until_blocked
from lockkit_tests.models import (
    QUEUE_SCHEMA,
    Item,
    Owner,
    PeerCity,
    PeerCountry,
    PeerCountryProxy,
    QueuedJob,
    RemoteItem,
)
from lockkit_tests.support.observe_helpers import recording
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON

pytestmark = pytest.mark.contention
POSTGRESQL = pytest.mark.django_db(transaction=True)
ITEM = Item._meta.db_table


def held_modes(table: str, alias: str = "default") -> list[str]:
    """The table lock modes this thread's session holds on ``table`` (``pg_locks``)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT mode FROM pg_locks WHERE locktype = 'relation' AND relation = %s::regclass "
            "AND pid = pg_backend_pid() AND granted ORDER BY mode",
            [table],
        )
        return [row[0] for row in cursor.fetchall()]


def lock_name(mode: TableLockMode) -> str:
    """``pg_locks.mode`` for a table lock mode: ``SHARE ROW EXCLUSIVE`` -> ``ShareRowExclusiveLock``."""
    return "".join(word.capitalize() for word in mode.value.split()) + "Lock"


@contextlib.contextmanager
def table_held_elsewhere(model: Any, mode: str = "ACCESS EXCLUSIVE") -> Iterator[tuple[int, threading.Event]]:
    """Hold ``model``'s table from another session; yield its pid and the event that releases it early."""
    entered, release = threading.Event(), threading.Event()
    pid: dict[str, int] = {}

    def hold() -> None:
        try:
            with locked(lock_timeout=10) as scope:
                scope.lock_table(model, mode=mode)
                pid["pid"] = backend_pid()
                entered.set()
                assert release.wait(30)
        finally:
            connections.close_all()

    call = in_thread(hold)
    assert entered.wait(30), call.outcome(timeout=5)
    try:
        yield pid["pid"], release
    finally:
        release.set()
        call.result(timeout=30)


@POSTGRESQL
@pytest.mark.parametrize("mode", list(TableLockMode))
def test_every_mode_is_held_in_the_scope_and_released_after_it(mode: TableLockMode) -> None:
    for spelled in (mode, mode.value, mode.value.lower(), mode.name, f"  {mode.value.title()} "):
        with locked() as scope:
            scope.lock_table(Item, mode=spelled)
            assert lock_name(mode) in held_modes(ITEM)
        assert held_modes(ITEM) == []
        assert not connections["default"].in_atomic_block


@POSTGRESQL
def test_several_tables_are_locked_in_one_statement_in_name_order_each_once() -> None:
    connection = connections["default"]
    with locked() as scope, CaptureQueriesContext(connection) as queries:
        scope.lock_table(Owner, "lockkit_tests.Item", Item, Owner, mode="exclusive")
        assert held_modes(ITEM) == ["ExclusiveLock"]
        assert held_modes(Owner._meta.db_table) == ["ExclusiveLock"]
    statements = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("LOCK")]
    assert statements == ['LOCK TABLE "lockkit_tests_item", "lockkit_tests_owner" IN EXCLUSIVE MODE']


@POSTGRESQL
def test_a_proxy_model_locks_its_concrete_table_and_a_child_its_own_table() -> None:
    with locked() as scope:
        scope.lock_table(PeerCountryProxy, mode="SHARE")
        assert held_modes(PeerCountry._meta.db_table) == ["ShareLock"]
        assert held_modes("lockkit_tests_peerentity") == []  # the multi-table parent is not locked


@pytest.fixture
def queue_schema() -> Iterator[None]:
    """Make the unmanaged ``QueuedJob``'s schema and table (``db_table = 'schema"."table'``); drop both after."""
    connection = connections["default"]
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(QUEUE_SCHEMA)}")
    with connection.schema_editor() as editor:
        editor.create_model(QueuedJob)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP SCHEMA {quote(QUEUE_SCHEMA)} CASCADE")


@POSTGRESQL
@pytest.mark.usefixtures("queue_schema")
def test_an_unmanaged_schema_qualified_table_is_locked_as_its_db_table_names_it() -> None:
    with locked() as scope:
        scope.lock_table(QueuedJob, mode="SHARE ROW EXCLUSIVE")
        assert held_modes(f"{QUEUE_SCHEMA}.queued_job") == ["ShareRowExclusiveLock"]
    assert held_modes(f"{QUEUE_SCHEMA}.queued_job") == []


@POSTGRESQL
def test_an_explicit_nowait_overrides_the_scopes_own() -> None:
    with table_held_elsewhere(Item) as (holder, _):
        # A NOWAIT scope whose lock_table() is told to wait: it waits, and the timer ends it (LockTimeout).
        started = time.monotonic()
        with pytest.raises(LockTimeout), locked(nowait=True, lock_timeout=0.3) as scope:
            scope.lock_table(Item, mode="SHARE", nowait=False)
        assert time.monotonic() - started >= 0.25
        # A waiting scope whose lock_table() is told not to: it fails at once (LockNotAvailable).
        with pytest.raises(lockkit.LockNotAvailable), locked(lock_timeout=5) as scope:
            scope.lock_table(Item, mode="SHARE", nowait=True)
        assert session_exists(holder)


@POSTGRESQL
def test_hostile_inputs_are_refused_before_any_sql_and_leave_the_scope_usable() -> None:
    Owner.objects.create(name="someone")
    connection = connections["default"]
    with locked() as scope:
        cases: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
            (Owner.objects.first(), {}, TypeError, "scope.get"),
            (Owner.objects.all(), {}, TypeError, "QuerySet"),
            (Claimable, {}, ValueError, "abstract"),
            (42, {}, TypeError, "model"),
            (Item, {"mode": None}, TypeError, "mode"),
            (Item, {"mode": "ROW"}, ValueError, "mode"),
            (Item, {"mode": "ACCESS EXCLUSIVE MODE NOWAIT"}, ValueError, "mode"),
            (Item, {"mode": 'SHARE" ; DROP TABLE "lockkit_tests_item'}, ValueError, "mode"),
            (Item, {"nowait": 0}, TypeError, "nowait"),
            ("lockkit_tests", {}, ValueError, "model"),
            ("lockkit_tests.Item.extra", {}, ValueError, "model"),
        ]
        with CaptureQueriesContext(connection) as queries:
            for model, overrides, error, words in cases:
                kwargs: dict[str, Any] = {"mode": "SHARE", **overrides}
                with pytest.raises(error, match=words):
                    scope.lock_table(model, **kwargs)
            # A model routed to another database: its table there is not this transaction's.
            with pytest.raises(AliasMismatch, match="other"):
                scope.lock_table(Item, RemoteItem, mode="SHARE")
        assert queries.captured_queries == []
        assert held_modes(ITEM) == []
        Owner.objects.create(name="still usable")
    assert Owner.objects.count() == 2


@POSTGRESQL
def test_a_nested_scope_hands_its_table_lock_to_the_enclosing_transaction_or_gives_it_back() -> None:
    with locked() as outer:
        with locked() as inner:
            inner.lock_table(Item, mode="SHARE")
        assert held_modes(ITEM) == ["ShareLock"]
        with pytest.raises(RuntimeError, match="body failed"), locked() as failing:
            failing.lock_table(Owner, mode="EXCLUSIVE")
            assert held_modes(Owner._meta.db_table) == ["ExclusiveLock"]
            raise RuntimeError("body failed")
        # ROLLBACK TO SAVEPOINT released the failed scope's lock; the first one stays until the end.
        assert held_modes(Owner._meta.db_table) == []
        assert held_modes(ITEM) == ["ShareLock"]
        assert outer.nested is False
    assert held_modes(ITEM) == []


@POSTGRESQL
def test_the_scope_lock_timeout_bounds_lock_table_and_the_next_call_works() -> None:
    def setting() -> str:
        with connections["default"].cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            return str(cursor.fetchone()[0])

    before = setting()
    with table_held_elsewhere(Item) as (holder, _):
        started = time.monotonic()
        with pytest.raises(LockTimeout) as caught, locked(lock_timeout=0.3) as scope:
            scope.lock_table(Item, mode="ACCESS SHARE")
            pytest.fail("must not be granted")
        elapsed = time.monotonic() - started
        assert 0.25 <= elapsed < 3, elapsed
        assert caught.value.sqlstate == "55P03"
        assert caught.value.alias == "default"
        # The server ended the wait itself: nothing of the failed statement is still running.
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            assert cursor.fetchone()[0] == 0
        assert session_exists(holder)
    assert setting() == before
    with locked(lock_timeout=1) as scope:
        scope.lock_table(Item, mode="ACCESS EXCLUSIVE", nowait=True)
        assert held_modes(ITEM) == ["AccessExclusiveLock"]
    assert held_modes(ITEM) == []


def session_exists(pid: int) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return bool(cursor.fetchone()[0])


@POSTGRESQL
def test_locked_operation_retries_a_table_lock_timeout_in_a_fresh_transaction() -> None:
    with table_held_elsewhere(Item) as (holder, release):
        attempts: list[int] = []

        def give_up_the_lock(event: object) -> None:
            # Between the attempts: the holder ends its transaction, and the server shows its lock gone.
            release.set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with connections["default"].cursor() as cursor:
                    cursor.execute(
                        "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'relation'", [holder]
                    )
                    if cursor.fetchone()[0] == 0:
                        return
                time.sleep(0.01)

        @locked_operation(lock_timeout=0.2, retry=RetryPolicy(attempts=3, before_retry=give_up_the_lock))
        def rebuild() -> int:
            scope = lockkit.current_scope()
            attempts.append(scope.attempt)
            scope.lock_table(Item, mode="EXCLUSIVE")
            return scope.attempt

        # The holder gives up its lock before the second attempt: that one is granted.
        assert rebuild() == 2
        assert attempts == [1, 2]


@POSTGRESQL
def test_a_table_lock_wait_shows_in_lock_inspection() -> None:
    with table_held_elsewhere(Item) as (holder, _):

        def waiter() -> None:
            try:
                with locked(lock_timeout=20) as scope:
                    scope.lock_table(Item, mode="SHARE")
            finally:
                connections.close_all()

        call = in_thread(waiter)
        [waiting] = wait_until_blocked(holder, contenders=call)
        [wait] = [w for w in lockkit.inspection.blocking() if w.waiting.pid == waiting]
        assert wait.lock_kind == "relation"
        assert wait.mode == "ShareLock"
        assert wait.target == ITEM
        assert wait.blocking_pids == (holder,)
    call.result(timeout=30)


@pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON)
@pytest.mark.django_db(transaction=True, databases=["default", "mariadb"])
def test_mariadb_refuses_lock_table_with_the_reason_before_any_sql() -> None:
    connection = connections["mariadb"]
    with locked("mariadb") as scope:
        with CaptureQueriesContext(connection) as queries:
            for mode in TableLockMode:
                with pytest.raises(NotSupportedError, match="LOCK TABLES commits the open transaction"):
                    scope.lock_table(Item, mode=mode)
        assert queries.captured_queries == []
        Item.objects.using("mariadb").create(name="the scope goes on")
    assert Item.objects.using("mariadb").count() == 1
    assert capabilities("mariadb").table_locks is None


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_sqlite_covers_every_mode_but_access_exclusive_with_its_write_lock() -> None:
    connection = connections["sqlite"]
    with locked("sqlite") as scope:
        with CaptureQueriesContext(connection) as queries:
            for mode in TableLockMode:
                if mode is TableLockMode.ACCESS_EXCLUSIVE:
                    with pytest.raises(NotSupportedError, match="not readers"):
                        scope.lock_table(Item, mode=mode)
                else:
                    scope.lock_table(Item, mode=mode)
        assert queries.captured_queries == []  # the scope's BEGIN IMMEDIATE already holds the write lock
        Item.objects.using("sqlite").create(name="the scope goes on")
    assert Item.objects.using("sqlite").count() == 1
    # Nested in a deferred atomic() block, the transaction may hold no lock at all: refused, not pretended.
    with transaction.atomic(using="sqlite"), locked("sqlite") as nested:
        with pytest.raises(NotSupportedError, match="write lock"):
            nested.lock_table(Item, mode="SHARE")
    caps = capabilities("sqlite")
    assert caps.table_locks is not None
    assert caps.table_locks.startswith("inside a scope only")


@POSTGRESQL
def test_capabilities_list_table_locks_on_postgresql() -> None:
    caps = capabilities("default")
    assert caps.table_locks is not None
    assert caps.table_locks.startswith("LOCK TABLE")
    assert "  table locks (lock_table)" in format_table(caps)
    # A vendor lockkit has no backend for: the row says so.
    assert "table locks (lock_table)           not supported" in format_table(Capabilities("x", "oracle"))


@POSTGRESQL
def test_a_table_lock_sends_lock_acquired_with_its_wait_and_a_failed_one_does_not() -> None:
    with table_held_elsewhere(PeerCity), recording() as recorder:
        with locked() as scope:
            scope.lock_table(Item, "lockkit_tests.Item", mode="SHARE")
            scope.lock_table(Owner, Item, mode="SHARE")  # the first table by name is Item's
        with pytest.raises(lockkit.LockNotAvailable), locked() as scope:
            scope.lock_table(PeerCity, mode="SHARE", nowait=True)
    sent = recorder.of("lock_acquired")
    assert [(s["model"], s["rows"], s["alias"]) for s in sent] == [(Item, 0, "default"), (Item, 0, "default")]
    assert all(0 <= s["wait"] < 5 for s in sent)
