"""locked() scopes on PostgreSQL: waiting, NOWAIT, timeouts set and restored, helpers, nesting, on_commit."""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import pytest
from django.db import DatabaseError, OperationalError, connection, connections, transaction
from django.db.transaction import TransactionManagementError

import lockkit
from lockkit import LockTimeout
from lockkit.testing import hold_lock, run_concurrently
from lockkit_tests.models import Item, Owner, RemoteItem, Stock
from lockkit_tests.support.util import show

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.contention]


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


def test_on_commit_callback_failure_never_reruns_committed_work() -> None:
    counter = Stock.objects.create(sku="counter", available=0)
    calls: list[int] = []

    def bump_counter() -> None:
        with lockkit.locked(lock_timeout=0.05) as scope:
            row = scope.get(Stock, pk="counter")
            row.available += 1
            row.save()

    @lockkit.locked_operation(retry=lockkit.RetryPolicy(attempts=3, wait_initial=0.001, wait_max=0.001))
    def place_order(n: int) -> None:
        calls.append(n)
        Stock.objects.create(sku=f"order-{len(calls)}", available=n)
        lockkit.current_scope().on_commit(bump_counter)

    with hold_lock(counter), pytest.raises(lockkit.OnCommitError) as info:
        place_order(1)
    assert isinstance(info.value.__cause__, LockTimeout)  # the callback's error, after the commit
    assert calls == [1]  # committed once, never re-run
    assert list(Stock.objects.filter(sku__startswith="order-").values_list("sku", flat=True)) == ["order-1"]


def test_callback_database_error_after_commit_is_not_reclassified() -> None:
    def broken() -> None:
        with connection.cursor() as cursor:
            cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '40001'; END $$")

    with pytest.raises(lockkit.OnCommitError) as info, lockkit.locked() as scope:
        Stock.objects.create(sku="kept", available=1)
        scope.on_commit(broken)
    cause = info.value.__cause__
    assert isinstance(cause, OperationalError)  # the callback's own error, not a "failed commit"
    assert not isinstance(cause, lockkit.LockError)
    assert Stock.objects.filter(sku="kept").exists()


def test_on_commit_robust_must_be_a_bool() -> None:
    with lockkit.locked() as scope, pytest.raises(TypeError, match="robust"):
        scope.on_commit(lambda: None, robust="no")  # type: ignore[arg-type]


def test_nested_scope_that_swallowed_a_database_error_raises_and_keeps_nothing() -> None:
    held = Stock.objects.create(sku="held", available=1)
    with hold_lock(held), lockkit.locked():
        with pytest.raises(DatabaseError), lockkit.locked(lock_timeout=0.05) as inner:
            Stock.objects.create(sku="audit", available=1)
            with contextlib.suppress(
                OperationalError
            ):  # swallowed: the savepoint cannot be released any more
                inner.get(Stock, pk="held")
        assert not Stock.objects.filter(sku="audit").exists()
        assert show("lock_timeout") == "5s"  # the enclosing scope's value, restored by the rollback


def _generator() -> Generator[int, None, None]:
    with lockkit.locked("default"):
        yield 1


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_scope_exit_ends_its_own_scope_not_the_innermost() -> None:
    generator = _generator()
    next(generator)
    with lockkit.locked("other"):
        RemoteItem.objects.create(name="x")
        generator.close()  # exits the default scope, opened first
        assert connections["other"].in_atomic_block
        assert not connections["default"].in_atomic_block
    assert RemoteItem.objects.filter(name="x").exists()


def test_get_takes_any_field_name_as_a_lookup_name_included() -> None:
    """``get()``'s own parameters are positional-only: a model's ``name`` (or ``target``) field is a lookup."""
    Item.objects.create(name="a", value=1)
    Item.objects.create(name="b", value=2)
    with lockkit.locked() as scope:
        assert scope.get(Item, name="b").value == 2
        assert scope.get(Item.objects.all(), name="a", value=1).value == 1
        with pytest.raises(Item.DoesNotExist):
            scope.get(Item, name="c")
