"""Safe composition: rows in the order asked, two databases in one operation, errors after commit, nesting.

Each test reproduces a trap a new user fell into (issue "Safe composition"); each fails on the code before its fix.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from django.db import OperationalError, connections, transaction
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit import Failure, RetryPolicy
from lockkit.testing import hold_lock, run_concurrently
from lockkit_tests.models import Item, RemoteItem, Stock
from lockkit_tests.support.util import raise_sqlstate
from lockkit_tests.support.vendors import vendor_params

pytestmark = [pytest.mark.contention]

BOTH = pytest.mark.django_db(transaction=True, databases=["default", "other"])
FAST = RetryPolicy(attempts=3, wait_initial=0.001, wait_max=0.001)


# -- lock_all: the order asked, and no silently dropped key --------------------------------------------------------


@lockkit.locked_operation(model=Item, lock_timeout=5)
def transfer(src_id: int, dst_id: int, amount: int) -> tuple[int, int]:
    payer, payee = lockkit.current_scope().lock_all(Item, pks=[src_id, dst_id])
    payer.value -= amount
    payee.value += amount
    payer.save(update_fields=["value"])
    payee.save(update_fields=["value"])
    return payer.value, payee.value


@pytest.mark.django_db(transaction=True)
def test_payer_and_payee_keep_their_places_when_src_id_is_greater() -> None:
    payee = Item.objects.create(name="payee", value=0)
    payer = Item.objects.create(name="payer", value=100)
    assert payer.pk > payee.pk  # the case that swapped them: lock order is key order, result order is not
    with CaptureQueriesContext(connections["default"]) as queries:
        assert transfer(payer.pk, payee.pk, 30) == (70, 30)
    locking = [q["sql"] for q in queries if "FOR UPDATE" in q["sql"]]
    assert len(locking) == 1  # one statement...
    assert "ORDER BY" in locking[0].upper()  # ...taking the locks in key order
    assert dict(Item.objects.values_list("name", "value")) == {"payer": 70, "payee": 30}


@pytest.mark.parametrize(
    "alias",
    [
        *vendor_params(),
        pytest.param(
            "sqlite",
            id="sqlite",
            marks=[pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])],
        ),
    ],
)
def test_lock_all_missing_pk_raises_does_not_exist_naming_it(alias: str) -> None:
    first = Item.objects.using(alias).create(name="first")
    second = Item.objects.using(alias).create(name="second")
    absent = second.pk + 1000
    with lockkit.locked(alias) as scope:
        assert [i.name for i in scope.lock_all(Item, pks=[second.pk, first.pk])] == ["second", "first"]
        assert [i.name for i in scope.lock_all(Item, pks=[str(first.pk)])] == [
            "first"
        ]  # as the field stores it
        with pytest.raises(Item.DoesNotExist, match=f"pk {absent}, {absent + 1} on '{alias}'"):
            scope.lock_all(Item, pks=[first.pk, absent, second.pk, absent + 1])
        with pytest.raises(ValueError, match="pks: 'x' is not a valid Item primary key"):
            scope.lock_all(Item, pks=["x"])


@pytest.mark.parametrize("alias", vendor_params())
def test_lock_all_matches_keys_as_the_database_compares_them(alias: str) -> None:
    Stock.objects.using(alias).create(sku="a", available=1)
    Stock.objects.using(alias).create(sku="b", available=2)
    with lockkit.locked(alias) as scope:
        if connections[alias].vendor == "mysql":  # a case-insensitive collation: "B" finds "b"
            assert [r.sku for r in scope.lock_all(Stock, pks=["B", "a"])] == ["b", "a"]
        else:
            with pytest.raises(Stock.DoesNotExist, match="'B'"):
                scope.lock_all(Stock, pks=["B", "a"])


# -- scope.get(instance) / scope.lock(instance) --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_get_and_lock_take_an_instance_and_reread_its_row_under_lock() -> None:
    item = Item.objects.create(name="i", value=1)
    Item.objects.filter(pk=item.pk).update(value=7)  # the instance in memory is now stale
    with lockkit.locked() as scope, CaptureQueriesContext(connections["default"]) as queries:
        fresh = scope.get(item)
        assert fresh.value == 7
        assert fresh is not item
        assert item.value == 1  # left as it was
        assert [i.pk for i in scope.lock(item)] == [item.pk]
    assert all("FOR UPDATE" in q["sql"] for q in queries if q["sql"].startswith("SELECT"))
    elsewhere = Item.objects.using("other").create(name="o")
    with lockkit.locked() as scope:
        with pytest.raises(lockkit.AliasMismatch, match="'other'"):
            scope.get(elsewhere)
        with pytest.raises(ValueError, match="unsaved Item"):
            scope.get(Item(name="new"))


# -- two databases in one operation ---------------------------------------------------------------------------------


@lockkit.locked_operation(model=RemoteItem)
def write_ledger(name: str) -> None:
    RemoteItem.objects.using(lockkit.current_scope().alias).create(name=name)


def ledger(name: str | None = None) -> list[str]:
    rows = RemoteItem.objects.using("other").order_by("pk")
    return list((rows.filter(name=name) if name else rows).values_list("name", flat=True))


@BOTH
def test_outer_attempt_that_deadlocks_after_a_ledger_commit_is_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    Stock.objects.create(sku="A", available=10)
    Stock.objects.create(sku="B", available=10)
    barrier = threading.Barrier(2)
    attempts: list[str] = []

    @lockkit.locked_operation(model=Stock, lock_timeout=10)  # the default policy retries deadlocks
    def pay(first: str, second: str) -> str:
        attempts.append(first)
        write_ledger(f"paid-{first}")  # commits on "other" at once, inside the attempt
        scope = lockkit.current_scope()
        scope.get(Stock, sku=first)
        if scope.attempt == 1:
            barrier.wait(30)
        scope.get(Stock, sku=second)
        return first

    with caplog.at_level(logging.INFO, logger="lockkit"):
        outcomes = run_concurrently(pay, 2, args=[("A", "B"), ("B", "A")], timeout=60)
    errors = [o.error for o in outcomes if o.error is not None]
    assert len(errors) == 1, outcomes
    error = errors[0]
    assert isinstance(error, lockkit.DeadlockDetected)
    assert error.attempts == 1
    assert sorted(attempts) == ["A", "B"]  # neither operation ran twice
    assert sorted(ledger()) == ["paid-A", "paid-B"]  # exactly one ledger row each, the victim's included
    notes = "\n".join(getattr(error, "__notes__", []))
    assert "committed on database 'other'" in notes
    assert "not retried" in notes
    (record,) = [r for r in caplog.records if "is not retried: work committed on 'other'" in r.getMessage()]
    assert record.committed_elsewhere == ("other",)  # type: ignore[attr-defined]


@BOTH
def test_a_retryable_failure_before_the_other_alias_commits_is_still_retried() -> None:
    stock = Stock.objects.create(sku="s", available=1)
    with hold_lock(stock) as holder:

        @lockkit.locked_operation(
            model=Stock,
            lock_timeout=0.2,
            retry=RetryPolicy(attempts=3, before_retry=lambda e: holder.release()),
        )
        def pay() -> int:
            lockkit.current_scope().get(Stock, sku="s")  # attempt 1 times out here, before the ledger write
            write_ledger("paid")
            return lockkit.current_scope().attempt

        assert pay() == 2
    assert ledger() == ["paid"]


@BOTH
def test_a_locked_block_failing_after_another_alias_committed_says_so() -> None:
    stock = Stock.objects.create(sku="s", available=1)
    with hold_lock(stock), pytest.raises(lockkit.LockTimeout) as caught:
        with lockkit.locked(lock_timeout=0.1) as scope:
            write_ledger("kept")
            scope.get(Stock, sku="s")
    assert scope.committed_elsewhere == ("other",)
    assert any("committed on database 'other'" in note for note in caught.value.__notes__)
    assert ledger() == ["kept"]  # no two-phase commit: it stays


# -- an on_commit callback failing after the commit ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_on_commit_error_carries_the_result_and_escapes_except_operational_error() -> None:
    calls: list[int] = []

    def notify() -> None:
        raise_sqlstate("40001")  # a retryable-looking database error, after the commit

    @lockkit.locked_operation(retry=FAST)
    def place_order() -> str:
        calls.append(1)
        Stock.objects.create(sku=f"order-{len(calls)}", available=1)
        lockkit.current_scope().on_commit(notify)
        return "receipt-1"

    caught_as_operational = False
    with pytest.raises(lockkit.OnCommitError) as info:
        try:
            place_order()
        except OperationalError:  # a caller's generic "catch and retry" must not see it
            caught_as_operational = True
    assert not caught_as_operational
    error = info.value
    assert error.result == "receipt-1"
    assert error.alias == "default"
    assert not isinstance(error, lockkit.LockError)
    assert isinstance(error.__cause__, OperationalError)  # the callback's own exception
    assert lockkit.classify(error.__cause__) is Failure.SERIALIZATION_FAILURE
    assert calls == [1]
    assert list(Stock.objects.values_list("sku", flat=True)) == ["order-1"]  # committed once


@pytest.mark.django_db(transaction=True)
def test_robust_callback_failure_is_logged_and_the_result_returned(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("mail server down")

    @lockkit.locked_operation()
    def op() -> str:
        scope = lockkit.current_scope()
        scope.on_commit(broken, robust=True)
        scope.on_commit(lambda: ran.append("next"))
        return "done"

    with caplog.at_level(logging.ERROR, logger="django.db.backends.base"):
        assert op() == "done"
    assert ran == ["next"]
    assert any("mail server down" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db(transaction=True)
def test_on_commit_error_from_a_locked_block() -> None:
    def broken() -> None:
        raise KeyError("x")

    with pytest.raises(lockkit.OnCommitError, match="do not retry") as info, lockkit.locked() as scope:
        Stock.objects.create(sku="kept", available=1)
        scope.on_commit(broken)
    assert info.value.result is None
    assert isinstance(info.value.__cause__, KeyError)
    assert Stock.objects.filter(sku="kept").exists()


# -- retries off when nested ---------------------------------------------------------------------------------------


@lockkit.locked_operation(lock_timeout=0.1)
def take(sku: str) -> int:
    return lockkit.current_scope().get(Stock, sku=sku).available


@pytest.mark.django_db(transaction=True)
def test_nested_call_says_why_it_was_not_retried(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    stock = Stock.objects.create(sku="hot", available=1)
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    with caplog.at_level(logging.DEBUG, logger="lockkit"), hold_lock(stock):
        with transaction.atomic(), pytest.raises(lockkit.LockTimeout) as caught:
            take("hot")
    error = caught.value
    assert error.attempts == 1
    note = "\n".join(error.__notes__)
    assert "not retried" in note
    assert "take ran inside transaction.atomic() on 'default'" in note
    assert "non_atomic_requests" in note
    records = [r for r in caplog.records if "was not retried" in r.getMessage()]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    assert records[0].alias == "default"  # type: ignore[attr-defined]
    assert records[0].nested is True  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_nested_in_a_lockkit_scope_names_it_and_non_retryable_errors_get_no_note() -> None:
    stock = Stock.objects.create(sku="hot", available=1)
    with hold_lock(stock):
        with lockkit.locked(), pytest.raises(lockkit.LockTimeout) as caught:
            take("hot")
        assert "an enclosing lockkit scope on 'default'" in "\n".join(caught.value.__notes__)

        nowait_take = lockkit.locked_operation(nowait=True)(take.__wrapped__)  # type: ignore[attr-defined]
        with transaction.atomic(), pytest.raises(lockkit.LockNotAvailable) as refused:
            nowait_take("hot")  # not retried by the policy anyway: nothing to explain
        assert not getattr(refused.value, "__notes__", [])


# -- NOWAIT behind a table lock -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_nowait_scope_blocked_by_a_table_lock_raises_lock_timeout() -> None:
    Stock.objects.create(sku="a", available=1)
    migration = connections.create_connection("default")  # another session, as a migration would be
    try:
        with migration.cursor() as cursor:
            migration.set_autocommit(False)
            cursor.execute(f"LOCK TABLE {Stock._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with (
            pytest.raises(lockkit.LockTimeout) as caught,
            lockkit.locked(nowait=True, lock_timeout=0.3) as scope,
        ):
            scope.get(Stock, sku="a")
        waited = time.monotonic() - started
    finally:
        migration.rollback()
        migration.close()
    assert waited >= 0.3  # it really waited the lock timeout: "did not wait" would be a lie
    assert caught.value.sqlstate == "55P03"
    assert not isinstance(caught.value, lockkit.LockNotAvailable)
    cause = caught.value.__cause__
    assert cause is not None
    assert lockkit.classify(cause, nowait=True) is Failure.LOCK_TIMEOUT


@pytest.mark.django_db(transaction=True)
def test_nowait_scope_on_a_held_row_still_raises_lock_not_available_at_once() -> None:
    stock = Stock.objects.create(sku="a", available=1)
    with hold_lock(stock), pytest.raises(lockkit.LockNotAvailable) as caught:
        with lockkit.locked(nowait=True, lock_timeout=30) as scope:
            scope.get(Stock, sku="a")
    cause = caught.value.__cause__
    assert cause is not None
    assert lockkit.classify(cause) is Failure.LOCK_NOT_AVAILABLE


def _session_values(alias: str) -> tuple[Any, ...]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT @@SESSION.max_statement_time, @@SESSION.innodb_lock_wait_timeout")
        row = cursor.fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize("alias", vendor_params())
def test_on_commit_callbacks_run_with_the_connections_own_timeouts(alias: str) -> None:
    """A callback's 1 s query after a scope whose statement_timeout is 0.5 s must run to completion."""
    vendor = connections[alias].vendor
    before = _session_values(alias) if vendor == "mysql" else None
    seen: list[Any] = []

    def slow_callback() -> None:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT SLEEP(1)" if vendor == "mysql" else "SELECT pg_sleep(1), 0")
            seen.append(cursor.fetchone()[0] if vendor == "mysql" else 0)
        if vendor == "mysql":
            seen.append(_session_values(alias))

    @lockkit.locked_operation(alias, statement_timeout=0.5, lock_timeout=3)
    def op() -> str:
        Stock.objects.using(alias).create(sku="s", available=1)
        lockkit.current_scope().on_commit(slow_callback)
        return "ok"

    assert op() == "ok"
    assert seen[0] == 0  # the sleep ran to its end, not cut at 0.5 s
    if vendor == "mysql":
        assert seen[1] == before  # the scope's session values were already put back
        assert _session_values(alias) == before
