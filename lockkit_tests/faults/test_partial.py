"""No partial commit on any vendor: a database error raised by a lockkit helper dooms the scope's block, even
when the body catches it and carries on (issue 11, item 4).

InnoDB rolls the whole transaction back on a deadlock (1213) and lets the connection carry on in a new one; a
body that swallowed the deadlock and went on writing must not get those later writes committed.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
from django.db import connections, transaction
from django.db.models import F

import lockkit
from lockkit.testing import in_thread
from lockkit_tests.models import Stock
from lockkit_tests.support.vendors import vendor_params

JOIN = 30.0


def _accounts(alias: str) -> None:
    Stock.objects.using(alias).bulk_create([Stock(sku="a", available=100), Stock(sku="b", available=100)])


def _balances(alias: str) -> tuple[int, int]:
    rows = dict(Stock.objects.using(alias).values_list("sku", "available"))
    return rows["a"], rows["b"]


def _transfer(alias: str, source: str, target: str, barrier: threading.Barrier, *, nested: bool) -> str:
    """Move 10 units, catching a deadlock on the second row and carrying on, as much real code does."""

    def body() -> str:
        with lockkit.locked(alias, lock_timeout=20) as scope:
            row = scope.get(Stock, pk=source)
            row.available -= 10
            row.save(using=alias)
            barrier.wait(JOIN)
            outcome = "locked both"
            try:
                scope.get(Stock, pk=target)
            except lockkit.DeadlockDetected:
                outcome = "swallowed a deadlock"  # "retry the statement that failed" and go on
            Stock.objects.using(alias).filter(pk=target).update(available=F("available") + 10)
            return outcome

    if not nested:
        return body()
    with transaction.atomic(using=alias):
        return body()


@pytest.mark.parametrize("nested", [False, True], ids=["outermost", "nested"])
@pytest.mark.parametrize("alias", vendor_params())
def test_a_deadlock_swallowed_in_the_body_commits_nothing(alias: str, nested: bool) -> None:
    _accounts(alias)
    barrier = threading.Barrier(2)
    calls = [
        in_thread(_transfer, alias, "a", "b", barrier, nested=nested),
        in_thread(_transfer, alias, "b", "a", barrier, nested=nested),
    ]
    outcomes = [call.outcome(JOIN) for call in calls]
    errors = [outcome.error for outcome in outcomes if outcome.error is not None]
    results = [outcome.result for outcome in outcomes if outcome.error is None]
    # One transfer is the deadlock victim: it ends with DeadlockDetected (never MariaDB's 1305 "SAVEPOINT does
    # not exist"), even though its body swallowed the error; the other commits.
    assert len(errors) == 1, errors
    assert type(errors[0]) is lockkit.DeadlockDetected, repr(errors[0])
    assert results == ["locked both"]
    a, b = _balances(alias)
    assert a + b == 200  # no money created: the victim's later write was not committed
    assert (a, b) in {(90, 110), (110, 90)}


@pytest.mark.parametrize("alias", vendor_params())
def test_a_swallowed_helper_error_is_raised_at_the_end_of_the_scope(alias: str) -> None:
    _accounts(alias)
    with pytest.raises(lockkit.LockNotAvailable):  # MariaDB reports NOWAIT as 1205 too
        with lockkit.locked(alias, nowait=True) as scope:
            row = scope.get(Stock, pk="a")
            row.available -= 10
            row.save(using=alias)
            other = connections.create_connection(alias)
            try:
                with other.cursor() as cursor:
                    cursor.execute("BEGIN")
                    table = other.ops.quote_name(Stock._meta.db_table)
                    cursor.execute(f"SELECT * FROM {table} WHERE sku = %s FOR UPDATE", ["b"])
                    with contextlib.suppress(lockkit.LockError):  # swallowed, as much real code does
                        scope.get(Stock, pk="b")
                    cursor.execute("ROLLBACK")
            finally:
                other.close()
    assert _balances(alias) == (100, 100)
