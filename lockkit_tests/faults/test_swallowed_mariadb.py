"""A body that swallows a failed statement on MariaDB is never reported as done (issue 23, item 4).

InnoDB rolls the whole transaction back on a deadlock and runs the body's later statements in a new one, which the
COMMIT then commits: half a transaction. A failed ORM write marks Django's block for rollback, so the COMMIT becomes
a ROLLBACK. Neither leaves a state the driver reports, so the scope watches its statements (``execute_wrapper()``).
"""

from __future__ import annotations

import contextlib
import threading

import pytest
from django.conf import settings
from django.db import DatabaseError, IntegrityError, OperationalError, connections, transaction
from django.db.models import F

import lockkit
from lockkit.testing import hold_lock, in_thread
from lockkit_tests.models import Item, Stock

ALIAS = "mariadb"
JOIN = 30.0

pytestmark = [
    pytest.mark.skipif(
        ALIAS not in settings.DATABASES, reason="no MariaDB/MySQL configured: set LOCKKIT_TEST_MYSQL_URL"
    ),
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS]),
]

_LOCK_ROW = "SELECT available FROM lockkit_tests_stock WHERE sku = %s FOR UPDATE"


def _items() -> list[str]:
    return sorted(Item.objects.using(ALIAS).values_list("name", flat=True))


def _next_call_works() -> None:
    with lockkit.locked(ALIAS) as scope:
        assert scope.get(Stock, pk="a").sku == "a"
        Item.objects.using(ALIAS).create(name="next")
    assert "next" in _items()


def _lock_both(first: str, second: str, barrier: threading.Barrier, *, orm: bool) -> str:
    """Lock ``first``, meet the other thread, lock ``second`` (a deadlock), swallow the error and carry on."""
    swallowed = ""
    with lockkit.locked(ALIAS, lock_timeout=10):
        Item.objects.using(ALIAS).create(name=f"before-{first}")
        with connections[ALIAS].cursor() as cursor:
            cursor.execute(_LOCK_ROW, [first])
        barrier.wait(JOIN)
        try:
            if orm:
                Stock.objects.using(ALIAS).filter(pk=second).update(available=F("available") + 1)
            else:
                with connections[ALIAS].cursor() as cursor:
                    cursor.execute(_LOCK_ROW, [second])
        except DatabaseError as exc:  # the bug: InnoDB rolled everything back, the body carries on
            swallowed = str(exc)
        if not orm:  # Django refuses statements in a block an ORM failure marked for rollback
            Item.objects.using(ALIAS).create(name=f"after-{first}")
    return swallowed


@pytest.mark.parametrize("orm", [False, True], ids=["raw-cursor", "orm-update"])
def test_a_swallowed_innodb_deadlock_raises_transaction_aborted_and_commits_nothing(orm: bool) -> None:
    Stock.objects.using(ALIAS).bulk_create([Stock(sku="a", available=1), Stock(sku="b", available=1)])
    barrier = threading.Barrier(2)
    calls = [
        in_thread(_lock_both, "a", "b", barrier, orm=orm),
        in_thread(_lock_both, "b", "a", barrier, orm=orm),
    ]
    outcomes = [call.outcome(JOIN) for call in calls]
    aborted = [o for o in outcomes if isinstance(o.error, lockkit.TransactionAborted)]
    winners = [o for o in outcomes if o.error is None]
    assert (len(aborted), len(winners)) == (1, 1), outcomes
    error = aborted[0].error
    assert isinstance(error, lockkit.TransactionAborted)
    assert "1213" in error.swallowed
    assert error.alias == ALIAS
    assert "nothing was committed" in str(error)
    assert winners[0].result == ""  # the survivor waited, then got the row: nothing to swallow
    winner = "a" if outcomes[0] is winners[0] else "b"
    # Only the survivor's writes: the victim's "after" row was not committed in InnoDB's new transaction.
    expected = [f"before-{winner}"] + ([] if orm else [f"after-{winner}"])
    assert _items() == sorted(expected)
    loser = "b" if winner == "a" else "a"
    assert dict(Stock.objects.using(ALIAS).values_list("sku", "available")) == {
        winner: 1,
        loser: 1 + int(orm),  # the survivor's ORM update of the victim's row committed
    }
    _next_call_works()


def test_a_swallowed_lock_wait_timeout_raises_transaction_aborted_and_commits_nothing() -> None:
    """InnoDB undoes only the timed-out statement (1205): the COMMIT would keep the writes around it.

    As on PostgreSQL, whose transaction the failure aborts: nothing is committed, and the scope says so.
    """
    Stock.objects.using(ALIAS).create(sku="a", available=1)
    with hold_lock(Stock.objects.using(ALIAS).filter(sku="a")):
        with pytest.raises(lockkit.TransactionAborted, match="1205") as caught:
            with lockkit.locked(ALIAS, lock_timeout=0.5):
                Item.objects.using(ALIAS).create(name="before the timeout")
                with contextlib.suppress(
                    OperationalError
                ):  # the bug: a plain ORM lock, its timeout swallowed
                    Stock.objects.using(ALIAS).select_for_update().get(sku="a")
                Item.objects.using(ALIAS).create(name="after the timeout")
    assert "1205" in caught.value.swallowed
    assert _items() == []
    _next_call_works()


def test_a_swallowed_orm_integrity_error_raises_transaction_aborted() -> None:
    Stock.objects.using(ALIAS).create(sku="a", available=1)
    with pytest.raises(lockkit.TransactionAborted, match="Duplicate entry") as caught, lockkit.locked(ALIAS):
        Item.objects.using(ALIAS).create(name="written before the failure")
        with contextlib.suppress(IntegrityError):  # the bug: Django marked the block for rollback
            Stock.objects.using(ALIAS).create(sku="a", available=2)
    assert "1062" in caught.value.swallowed
    assert _items() == []
    assert Stock.objects.using(ALIAS).get().available == 1
    _next_call_works()


def test_an_error_undone_by_its_own_savepoint_and_a_deliberate_rollback_are_not_errors() -> None:
    Stock.objects.using(ALIAS).create(sku="a", available=1)
    with lockkit.locked(ALIAS):
        Item.objects.using(ALIAS).create(name="kept")
        with contextlib.suppress(IntegrityError), transaction.atomic(using=ALIAS):
            Stock.objects.using(ALIAS).create(sku="a", available=2)  # Django's documented pattern
    assert _items() == ["kept"]
    with lockkit.locked(ALIAS):
        Item.objects.using(ALIAS).create(name="rolled back on purpose")
        transaction.set_rollback(True, using=ALIAS)
    assert _items() == ["kept"]
    _next_call_works()
