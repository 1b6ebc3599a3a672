"""A body that catches a database error is never reported as done (issue 23, item 4).

On PostgreSQL a failed statement aborts the transaction, and a COMMIT of an aborted transaction is answered with
ROLLBACK, not an error: without a check, the outermost scope would return normally with its writes gone.
"""

from __future__ import annotations

import contextlib

import pytest
from django.db import DatabaseError, IntegrityError, connections, transaction

import lockkit
from lockkit import RetryEvent, RetryPolicy
from lockkit_tests.models import Item, Stock

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


def _write_then_swallow() -> None:
    Item.objects.create(name="written before the failure")
    try:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
    except DatabaseError:
        pass  # the bug: the transaction is aborted, the body carries on


def test_a_swallowed_error_in_an_outermost_locked_block_raises_transaction_aborted() -> None:
    callbacks: list[str] = []
    with pytest.raises(lockkit.TransactionAborted) as caught, lockkit.locked() as scope:
        _write_then_swallow()
        scope.on_commit(lambda: callbacks.append("sent"))
    error = caught.value
    assert isinstance(error, DatabaseError)  # `except DatabaseError` catches it
    assert error.alias == "default"
    assert "division by zero" in error.swallowed
    assert "nothing was committed" in str(error)
    assert Item.objects.count() == 0
    assert callbacks == []
    with lockkit.locked():  # the next call on the same connection works
        Item.objects.create(name="next")
    assert list(Item.objects.values_list("name", flat=True)) == ["next"]


def test_a_locked_operation_that_swallows_an_error_raises_and_is_not_retried() -> None:
    Stock.objects.create(sku="widget", available=5)
    events: list[RetryEvent] = []
    calls: list[int] = []

    @lockkit.locked_operation(retry=RetryPolicy(before_retry=events.append))
    def sell() -> int:
        calls.append(1)
        row = lockkit.current_scope().get(Stock, pk="widget")
        row.available -= 1
        row.save()
        with contextlib.suppress(IntegrityError):  # the bug: a duplicate key swallowed
            Stock.objects.create(sku="widget", available=1)
        return row.available

    with pytest.raises(lockkit.TransactionAborted, match="duplicate key"):
        sell()
    assert (calls, events) == ([1], [])
    assert Stock.objects.get().available == 5


def test_a_statement_that_may_fail_in_its_own_savepoint_commits_the_rest() -> None:
    with lockkit.locked():
        Item.objects.create(name="kept")
        try:
            with transaction.atomic(), connections["default"].cursor() as cursor:
                cursor.execute("SELECT 1 / 0")
        except DatabaseError:
            pass  # handled the way Django documents: the savepoint rolled back, the transaction is fine
    assert list(Item.objects.values_list("name", flat=True)) == ["kept"]


def test_a_nested_scope_inside_atomic_still_raises_and_the_outer_block_can_go_on() -> None:
    with transaction.atomic():
        Item.objects.create(name="outer")
        with pytest.raises(DatabaseError), lockkit.locked():
            _write_then_swallow()
    assert list(Item.objects.values_list("name", flat=True)) == ["outer"]


def test_a_deliberate_set_rollback_is_not_an_error() -> None:
    with lockkit.locked():
        Item.objects.create(name="rolled back on purpose")
        transaction.set_rollback(True)
    assert Item.objects.count() == 0
