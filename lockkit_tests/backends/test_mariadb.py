"""The core contention scenarios on a real MariaDB (10.11) or MySQL 8, plus what differs there.

Runs only when ``LOCKKIT_TEST_MYSQL_URL`` is set (the ``mariadb`` alias); skipped with that reason otherwise.
"""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import NotSupportedError, OperationalError, connections
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit import RetryEvent, RetryPolicy
from lockkit.backends.mysql.backend import lock_wait_seconds
from lockkit.testing import backend_pid, hold_lock, in_thread
from lockkit_tests.models import Item, Owner, Stock
from lockkit_tests.support.faultkit import extra_alias

ALIAS = "mariadb"

pytestmark = [
    pytest.mark.skipif(
        ALIAS not in settings.DATABASES, reason="no MariaDB/MySQL configured: set LOCKKIT_TEST_MYSQL_URL"
    ),
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS]),
]

JOIN = 20.0


def session_lock_wait() -> int:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def fail_inside(lock_timeout: float, seen: list[int]) -> None:
    with lockkit.locked(ALIAS, lock_timeout=lock_timeout):
        seen.append(session_lock_wait())
        raise ZeroDivisionError


def stock(available: int, sku: str = "widget") -> Stock:
    return Stock.objects.using(ALIAS).create(sku=sku, available=available)


def test_lock_timeout_rounds_up_to_whole_seconds() -> None:
    """innodb_lock_wait_timeout takes whole seconds; the scenario itself is in test_contention_scenarios.py."""
    assert lock_wait_seconds(0.2) == 1
    assert lock_wait_seconds(1.0) == 1
    assert lock_wait_seconds(1.01) == 2


def test_session_timeouts_are_restored_after_success_and_failure() -> None:
    stock(1)
    before = session_lock_wait()
    with lockkit.locked(ALIAS, lock_timeout=7) as scope:
        scope.get(Stock, pk="widget")
        assert session_lock_wait() == 7
    assert session_lock_wait() == before
    inside: list[int] = []
    with pytest.raises(ZeroDivisionError):
        fail_inside(8, inside)
    assert inside == [8]
    assert session_lock_wait() == before
    # Nested: the inner value lasts for the inner scope only; the outer one is back after success and error.
    with lockkit.locked(ALIAS, lock_timeout=3):
        with lockkit.locked(ALIAS, lock_timeout=9):
            assert session_lock_wait() == 9
        assert session_lock_wait() == 3
        with pytest.raises(ZeroDivisionError):
            fail_inside(11, inside)
        assert session_lock_wait() == 3
    assert inside == [8, 11]
    assert session_lock_wait() == before


def test_of_is_not_passed_on_mariadb_and_no_key_is_refused_before_sql() -> None:
    connection = connections[ALIAS]
    owner = Owner.objects.using(ALIAS).create(name="o")
    Item.objects.using(ALIAS).create(name="x", owner=owner)
    Item.objects.using(ALIAS).create(name="y", owner=None)
    with lockkit.locked(ALIAS) as scope:
        names = sorted(i.name for i in scope.lock(Item).select_related("owner"))
    assert names == ["x", "y"]
    if connection.features.has_select_for_update_of:
        pytest.skip("this server supports FOR UPDATE OF (MySQL 8); the refusal below is MariaDB's")
    with CaptureQueriesContext(connection) as queries, pytest.raises(NotSupportedError, match="no_key"):
        lockkit.locked(ALIAS, no_key=True).__enter__()
    assert [q["sql"] for q in queries.captured_queries] == []


def test_a_kept_connection_turned_read_only_is_discarded_and_the_retry_reconnects() -> None:
    """A kept session that became read-only (a failover left it on the old writer): issue 33, item 2."""
    stock(1)
    events: list[RetryEvent] = []

    @lockkit.locked_operation(ALIAS, retry=RetryPolicy(attempts=3, before_retry=events.append))
    def take() -> int:
        scope = lockkit.current_scope()
        scope.get(Stock, pk="widget")
        return scope.attempt

    connection = connections[ALIAS]
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION TRANSACTION READ ONLY")
        cursor.execute("SELECT CONNECTION_ID()")
        (kept,) = cursor.fetchone() or (None,)
    try:
        assert take() == 2  # nothing was written: retried once, on a new connection
        assert [(e.failure, e.sqlstate) for e in events] == [(lockkit.Failure.READ_ONLY, "1792")]
        with connection.cursor() as cursor:
            cursor.execute("SELECT CONNECTION_ID(), @@SESSION.tx_read_only")
            session, read_only = cursor.fetchone() or (None, None)
    finally:
        connection.close()  # a read-only session left by a regression must not reach the next test
    assert session != kept  # a new session...
    assert read_only == 0  # ...that writes


@pytest.mark.django_db(transaction=True, databases=["default", ALIAS, "proxied_mariadb"])
def test_a_read_only_server_raises_read_only_database_without_retry() -> None:
    """Every new connection is read-only too: one attempt (a fresh connection is never retried), then raised."""
    stock(1)
    events: list[RetryEvent] = []
    read_only = {
        **settings.DATABASES[ALIAS].get("OPTIONS", {}),
        "init_command": "SET SESSION TRANSACTION READ ONLY",
    }
    with extra_alias("proxied_mariadb", ALIAS, OPTIONS=read_only) as alias:

        @lockkit.locked_operation(alias, retry=RetryPolicy(attempts=3, before_retry=events.append))
        def take() -> None:
            lockkit.current_scope().get(Stock, pk="widget")

        for _ in range(2):  # the next call too: the server is read-only for every connection
            with pytest.raises(lockkit.ReadOnlyDatabase) as caught:
                take()
            assert caught.value.sqlstate == "1792"
            assert caught.value.attempts == 1
            assert caught.value.stale is False
    assert events == []


def test_a_session_lost_inside_a_scope_raises_its_own_error_and_leaks_nothing() -> None:
    """The restore after a failure cannot run on a dead session: the scope's error wins, nothing is reused."""
    stock(1)
    before = session_lock_wait()
    with pytest.raises(OperationalError) as caught, lockkit.locked(ALIAS, lock_timeout=7):
        assert session_lock_wait() == 7
        killer = connections.create_connection(ALIAS)
        try:
            with killer.cursor() as cursor:
                cursor.execute("KILL %s", [backend_pid(ALIAS)])
        finally:
            killer.close()
        Stock.objects.using(ALIAS).count()
    assert isinstance(caught.value, lockkit.ConnectionLost)  # classified, and discarded for the next call
    # MariaDB 10.11 + mysqlclient 2.3: 2013, lost connection
    assert caught.value.sqlstate in ("2006", "2013", "1927")
    assert session_lock_wait() == before  # a fresh session: the scope's 7 s did not survive


def test_skip_locked_leaves_out_the_rows_another_session_holds() -> None:
    held, free = stock(1, "held"), stock(1, "free")
    with hold_lock(held, using=ALIAS), lockkit.locked(ALIAS, skip_locked=True) as scope:
        skus = [s.sku for s in scope.lock(Stock).order_by("sku")]
    assert skus == [free.sku]


def _session_value(name: str) -> int:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(f"SELECT @@SESSION.{name}")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def test_a_metadata_lock_wait_is_bounded_by_the_scopes_lock_timeout_and_restored() -> None:
    """A scope behind a LOCK TABLES (or DDL) holder waits for a metadata lock: ``lock_wait_timeout``, a year by
    default, bounded by the scope like the row-lock wait (issue 23, item 11)."""
    stock(3)
    table = connections[ALIAS].ops.quote_name(Stock._meta.db_table)
    before = _session_value("lock_wait_timeout")
    holder = connections.create_connection(ALIAS)
    try:
        with holder.cursor() as cursor:
            cursor.execute(f"LOCK TABLES {table} WRITE")

        def reserve() -> None:
            with lockkit.locked(ALIAS, lock_timeout=1) as scope:
                scope.get(Stock, pk="widget")

        call = in_thread(reserve)
        with pytest.raises(lockkit.LockTimeout) as caught:
            call.result(JOIN)  # unbounded before: the wait outlived the join
        assert caught.value.sqlstate == "1205"
    finally:
        with holder.cursor() as cursor:
            cursor.execute("UNLOCK TABLES")
        holder.close()
    assert _session_value("lock_wait_timeout") == before  # restored on the test's connection's scopes too
    with lockkit.locked(ALIAS, lock_timeout=4):
        assert _session_value("lock_wait_timeout") == 4
        assert _session_value("innodb_lock_wait_timeout") == 4
    assert _session_value("lock_wait_timeout") == before


def _snapshot_isolation_on() -> None:
    """This thread's session: REPEATABLE READ with MariaDB 11.6.2+'s default ``innodb_snapshot_isolation=ON``."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SHOW VARIABLES LIKE 'innodb_snapshot_isolation'")
        if cursor.fetchone() is None:
            pytest.skip("this server has no innodb_snapshot_isolation (MariaDB 10.6.18+/10.11.8+/11.x)")
        cursor.execute("SET SESSION innodb_snapshot_isolation = ON")
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")


def test_a_row_changed_after_the_snapshot_is_a_retried_serialization_failure() -> None:
    """MariaDB 11.6+ (snapshot isolation on): a locking read of a row changed since the transaction's snapshot fails
    with 1020 and the transaction is rolled back; it is a serialization failure, retried in a fresh transaction."""
    stock(10)
    snapshot_taken = threading.Event()
    changed = threading.Event()
    events: list[RetryEvent] = []

    @lockkit.locked_operation(ALIAS, lock_timeout=5, retry=RetryPolicy(before_retry=events.append))
    def reserve_after_reading(quantity: int) -> tuple[int, int]:
        scope = lockkit.current_scope()
        Stock.objects.using(ALIAS).get(pk="widget")  # a plain read: the transaction's snapshot
        if scope.attempt == 1:
            snapshot_taken.set()
            assert changed.wait(JOIN), "the other reservation did not commit"
        row = scope.get(Stock, pk="widget")
        row.available -= quantity
        row.save(update_fields=["available"])
        return scope.attempt, row.available

    def worker() -> tuple[int, int]:
        try:
            _snapshot_isolation_on()
            return reserve_after_reading(1)
        finally:
            connections.close_all()

    call = in_thread(worker)
    assert snapshot_taken.wait(JOIN), call.result(JOIN)
    with lockkit.locked(ALIAS) as scope:  # the other reservation, committed after the worker's snapshot
        row = scope.get(Stock, pk="widget")
        row.available -= 2
        row.save(update_fields=["available"])
    changed.set()
    assert call.result(JOIN) == (2, 7)  # both reservations kept
    assert [(e.failure, e.sqlstate) for e in events] == [(lockkit.Failure.SERIALIZATION_FAILURE, "1020")]
    assert Stock.objects.using(ALIAS).get(pk="widget").available == 7


def test_a_swallowed_row_changed_since_the_snapshot_is_not_reported_as_done() -> None:
    """1020 rolled the whole transaction back, savepoints included: a body that catches it must not be told done."""
    stock(10)
    Owner.objects.using(ALIAS).create(name="before")

    def change_stock() -> None:
        try:
            Stock.objects.using(ALIAS).filter(pk="widget").update(available=9)
        finally:
            connections.close_all()

    _snapshot_isolation_on()
    try:
        with pytest.raises(lockkit.TransactionAborted, match="1020"), lockkit.locked(ALIAS):
            Owner.objects.using(ALIAS).create(name="in the rolled-back transaction")
            Stock.objects.using(ALIAS).get(pk="widget")  # the snapshot
            in_thread(change_stock).result(JOIN)
            with pytest.raises(OperationalError):  # the body's own locking read, caught by the body
                Stock.objects.using(ALIAS).select_for_update().get(pk="widget")
            Owner.objects.using(ALIAS).create(name="after, in a new transaction")
    finally:
        connections[ALIAS].close()  # the session's isolation settings go with it
    assert sorted(Owner.objects.using(ALIAS).values_list("name", flat=True)) == ["before"]
