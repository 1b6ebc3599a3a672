"""locked() scopes on PostgreSQL: waiting, NOWAIT, timeouts set and restored, helpers, nesting, on_commit."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.db.transaction import TransactionManagementError

import lockkit
from lockkit.testing import backend_pid, hold_lock, run_concurrently, wait_until_blocked
from lockkit_tests.models import Item, Owner, Stock
from lockkit_tests.util import reserve, show

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.contention]


def test_second_operation_waits_then_decides_on_committed_value() -> None:
    Stock.objects.create(sku="book-1", available=10)
    started = threading.Event()
    result: dict[str, Any] = {}

    def contender() -> None:
        try:
            started.set()
            result["remaining"] = reserve("book-1", 3)
        except BaseException as exc:  # surfaced in the main thread
            result["error"] = exc
        finally:
            connections.close_all()

    with lockkit.locked() as scope:
        stock = scope.get(Stock, sku="book-1")
        stock.available = 5
        stock.save(update_fields=["available"])
        holder = backend_pid()
        thread = threading.Thread(target=contender, daemon=True)
        thread.start()
        assert started.wait(5)
        blocked = wait_until_blocked(holder, timeout=10)
        assert len(blocked) == 1
        assert "remaining" not in result  # still waiting while we hold the row
    thread.join(15)
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    assert result["remaining"] == 2  # decided on the committed 5, not the 10 it could have read
    assert Stock.objects.get(sku="book-1").available == 2


def test_nowait_on_held_row_raises_lock_not_available() -> None:
    stock = Stock.objects.create(sku="a", available=1)
    with (
        hold_lock(stock),
        pytest.raises(lockkit.LockNotAvailable) as info,
        lockkit.locked(nowait=True) as scope,
    ):
        scope.get(Stock, sku="a")
    error = info.value
    assert error.sqlstate == "55P03"
    assert error.alias == "default"
    assert error.attempts == 1
    assert isinstance(error, OperationalError)
    assert isinstance(error.__cause__, OperationalError)
    assert lockkit.classify(error) is lockkit.Failure.LOCK_NOT_AVAILABLE


def test_lock_timeout_raises_lock_timeout() -> None:
    stock = Stock.objects.create(sku="a", available=1)
    with (
        hold_lock(stock),
        pytest.raises(lockkit.LockTimeout) as info,
        lockkit.locked(lock_timeout=0.2) as scope,
    ):
        scope.get(Stock, sku="a")
    assert info.value.sqlstate == "55P03"
    assert not isinstance(info.value, lockkit.LockNotAvailable)
    assert lockkit.classify(info.value) is lockkit.Failure.LOCK_TIMEOUT


def test_statement_timeout_raises_statement_timeout() -> None:
    with pytest.raises(lockkit.StatementTimeout) as info, lockkit.locked(statement_timeout=0.2):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(5)")
    assert info.value.sqlstate == "57014"


def test_timeouts_are_transaction_scoped_and_restored() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '7s'")  # a session value of the user's own
    assert show("lock_timeout") == "7s"
    with lockkit.locked(lock_timeout=0.2, statement_timeout=3):
        assert show("lock_timeout") == "200ms"
        assert show("statement_timeout") == "3s"
        with lockkit.locked(lock_timeout=1.5):
            assert show("lock_timeout") == "1500ms"
        assert show("lock_timeout") == "200ms"  # restored after a nested success
        with (
            pytest.raises(lockkit.StatementTimeout),
            lockkit.locked(lock_timeout=0.05, statement_timeout=0.1),
        ):
            assert show("lock_timeout") == "50ms"
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(5)")
        assert show("lock_timeout") == "200ms"  # restored after a nested failure
        assert show("statement_timeout") == "3s"
    assert show("lock_timeout") == "7s"  # nothing left on the session
    assert show("statement_timeout") == "0"


def test_nested_scope_inside_plain_atomic_restores_session_value() -> None:
    with transaction.atomic():
        before = show("lock_timeout")
        with lockkit.locked(lock_timeout=0.3):
            assert show("lock_timeout") == "300ms"
        assert show("lock_timeout") == before


def test_default_lock_timeout_is_finite_and_from_settings(settings: Any) -> None:
    with lockkit.locked():
        assert show("lock_timeout") == "5s"
    settings.LOCKKIT = {"LOCK_TIMEOUT": 0.75}
    with lockkit.locked():
        assert show("lock_timeout") == "750ms"
    settings.LOCKKIT = {"LOCK_TIMEOUT": None}
    with lockkit.locked():
        assert show("lock_timeout") == "0"  # None leaves the connection's own setting


def test_lock_timeout_accepts_timedelta_and_rounds_up_to_a_millisecond() -> None:
    from datetime import timedelta

    with lockkit.locked(lock_timeout=timedelta(milliseconds=250)):
        assert show("lock_timeout") == "250ms"
    with lockkit.locked(lock_timeout=0.0001):
        assert show("lock_timeout") == "1ms"  # never 0, which PostgreSQL reads as "wait forever"


def test_lock_all_returns_rows_in_the_order_of_pks_and_refuses_missing_ones() -> None:
    for sku in ("c", "a", "b", "d"):
        Stock.objects.create(sku=sku, available=1)
    with lockkit.locked() as scope:
        rows = scope.lock_all(Stock, pks=["d", "b", "a"])
        assert [r.sku for r in rows] == ["d", "b", "a"]  # the order asked; locks taken in key order
        assert [r.sku for r in scope.lock_all(Stock, pks=iter(["b", "b"]))] == ["b", "b"]
        assert [r.sku for r in scope.lock_all(Stock.objects.filter(available=1))] == ["a", "b", "c", "d"]
        with pytest.raises(Stock.DoesNotExist, match="'zz', 'yy'"):
            scope.lock_all(Stock, pks=["d", "zz", "a", "yy", "zz"])
        with pytest.raises(TypeError, match="pks"):
            scope.lock_all(Stock, pks="abc")


def test_select_related_nullable_fk_locks_only_the_queried_rows() -> None:
    owner = Owner.objects.create(name="o")
    item = Item.objects.create(name="i", owner=owner)
    orphan = Item.objects.create(name="j", owner=None)
    with lockkit.locked() as scope:
        locked_item = scope.lock(Item.objects.select_related("owner")).get(pk=item.pk)
        assert locked_item.owner == owner
        assert scope.lock(Item.objects.select_related("owner")).get(pk=orphan.pk).owner is None
        # The owner row is not locked: another session can take it with NOWAIT.
        with hold_lock(owner, nowait=True) as holder:
            assert [o.pk for o in holder.rows] == [owner.pk]
        # ...while the item row is.
        with pytest.raises(lockkit.LockNotAvailable), hold_lock(locked_item, nowait=True):
            pass


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_current_scope_and_lock_outside_scope_raise() -> None:
    with pytest.raises(lockkit.NotInLockedScope):
        lockkit.current_scope()
    with pytest.raises(lockkit.NotInLockedScope) as info:
        lockkit.lock(Stock)
    assert isinstance(info.value, TransactionManagementError)
    with lockkit.locked() as outer:
        assert lockkit.current_scope() is outer
        with lockkit.locked("other") as inner:
            assert lockkit.current_scope() is inner
            assert inner.alias == "other"
        assert lockkit.current_scope() is outer
    with pytest.raises(lockkit.NotInLockedScope):
        outer.lock(Stock)  # the scope has ended


def test_module_lock_uses_innermost_scope() -> None:
    Stock.objects.create(sku="a", available=4)
    with lockkit.locked():
        queryset = lockkit.lock(Stock.objects.filter(sku="a"))
        assert queryset.db == "default"
        assert [s.available for s in queryset] == [4]


def test_on_commit_runs_once_after_outermost_commit_and_never_for_rollback() -> None:
    ran: list[str] = []
    with transaction.atomic():
        with lockkit.locked() as scope:
            scope.on_commit(lambda: ran.append("kept"))
        with pytest.raises(lockkit.StatementTimeout), lockkit.locked(statement_timeout=0.05) as scope:
            scope.on_commit(lambda: ran.append("rolled back"))
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(2)")
        assert ran == []  # not before the outermost commit
    assert ran == ["kept"]


def test_nested_failure_leaves_outer_transaction_usable() -> None:
    stock = Stock.objects.create(sku="a", available=1)
    with transaction.atomic():
        Stock.objects.create(sku="outer", available=9)
        with hold_lock(stock), pytest.raises(lockkit.LockTimeout):
            with lockkit.locked(lock_timeout=0.1) as scope:
                scope.get(Stock, sku="a")
        Stock.objects.create(sku="after", available=3)
    assert sorted(Stock.objects.values_list("sku", flat=True)) == ["a", "after", "outer"]


def test_one_locked_object_shared_by_threads() -> None:
    Stock.objects.create(sku="a", available=0)
    shared = lockkit.locked(lock_timeout=10)

    def bump() -> str:
        with shared as scope:
            stock = scope.get(Stock, sku="a")
            stock.available += 1
            stock.save(update_fields=["available"])
            return scope.alias

    outcomes = run_concurrently(bump, 8, timeout=60)
    assert [o.error for o in outcomes] == [None] * 8
    assert Stock.objects.get(sku="a").available == 8


def test_locked_as_bare_decorator_runs_in_scope() -> None:
    @lockkit.locked
    def inside() -> bool:
        return connection.in_atomic_block and lockkit.current_scope().alias == "default"

    assert inside() is True
    assert connection.in_atomic_block is False


def test_nested_scope_with_swallowed_inner_error_still_restores_timeouts() -> None:
    from django.db import IntegrityError

    Stock.objects.create(sku="dup", available=1)
    with lockkit.locked(lock_timeout=0.4):
        with lockkit.locked(lock_timeout=0.9):
            try:
                with transaction.atomic():
                    Stock.objects.create(sku="dup", available=2)
            except IntegrityError:
                pass  # handled properly, in its own savepoint: the scope goes on
            transaction.set_rollback(True)  # ...and then the user decides to roll this scope back
        assert show("lock_timeout") == "400ms"
    assert Stock.objects.get(sku="dup").available == 1


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_test_databases_resolve_deadlocks_fast() -> None:
    for alias in ("default", "other"):
        assert show("deadlock_timeout", alias) == "100ms"  # set by conftest.py on each test database
