"""The contention scenarios every vendor must pass, each written once: PostgreSQL, MariaDB, PgBouncer.

NOWAIT fails at once; a lock wait ends at the scope's lock timeout, a slow statement at its statement timeout;
a nested operation never retries and leaves the outer transaction usable; a waiter decides on the value committed
before it got the lock; a deadlock is retried (or reported) and both transfers keep the totals; concurrent buyers
never oversell.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import OperationalError, connections, transaction
from django.db.models import F

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.testing import backend_pid, hold_lock, in_thread, run_concurrently, wait_until_blocked
from lockkit_tests.models import Stock
from lockkit_tests.support.util import InsufficientStock, reserve_one_on
from lockkit_tests.support.vendors import Target, target_params

pytestmark = pytest.mark.contention
TARGETS = target_params()
JOIN = 30.0


def _nowait_code(target: Target) -> str:
    """MariaDB reports a NOWAIT failure with 1205, the lock wait timeout's number; MySQL 8 with 3572."""
    connection = connections[target.alias]
    if connection.vendor == "postgresql":
        return "55P03"
    return "1205" if connection.mysql_is_mariadb else "3572"  # type: ignore[attr-defined]


@pytest.mark.parametrize("target", TARGETS)
def test_nowait_on_a_held_row_raises_lock_not_available_at_once(target: Target) -> None:
    row = Stock.objects.using(target.data).create(sku="widget", available=1)
    with hold_lock(row):
        started = time.monotonic()
        with (
            pytest.raises(lockkit.LockNotAvailable) as caught,
            lockkit.locked(target.alias, nowait=True) as scope,
        ):
            scope.get(Stock, pk="widget")
        elapsed = time.monotonic() - started
    error = caught.value
    assert (error.sqlstate, error.alias, error.attempts) == (_nowait_code(target), target.alias, 1)
    assert isinstance(error, OperationalError)
    assert isinstance(error.__cause__, OperationalError)  # lockkit <- Django <- the driver's own error
    driver = {"postgresql": "psycopg", "mysql": "MySQLdb"}[connections[target.alias].vendor]
    assert type(error.__cause__.__cause__).__module__.startswith(driver)
    assert lockkit.classify(error) is Failure.LOCK_NOT_AVAILABLE
    assert elapsed < 1.0  # failed at once, not after the lock timeout


def _read(target: Target, sql: dict[str, str]) -> str:
    """One value read on this thread's session, outside any scope (PgBouncer: on the server it lands on)."""
    connection = connections[target.alias]
    with connection.cursor() as cursor:
        cursor.execute(sql[connection.vendor])
        (value,) = cursor.fetchone()
    return str(value)


LOCK_TIMEOUT = {
    "postgresql": "SELECT current_setting('lock_timeout')",
    "mysql": "SELECT @@SESSION.innodb_lock_wait_timeout",
}


@pytest.mark.parametrize("target", TARGETS)
def test_a_held_row_raises_lock_timeout_after_the_scope_lock_timeout(target: Target) -> None:
    row = Stock.objects.using(target.data).create(sku="widget", available=1)
    before = _read(target, LOCK_TIMEOUT)
    # InnoDB takes whole seconds: 0.3 s becomes innodb_lock_wait_timeout = 1.
    waited = 1.0 if connections[target.alias].vendor == "mysql" else 0.3
    with hold_lock(row):
        started = time.monotonic()
        with (
            pytest.raises(lockkit.LockTimeout) as caught,
            lockkit.locked(target.alias, lock_timeout=0.3) as scope,
        ):
            scope.get(Stock, pk="widget")
        elapsed = time.monotonic() - started
    error = caught.value
    assert error.sqlstate == {"postgresql": "55P03", "mysql": "1205"}[connections[target.alias].vendor]
    assert not isinstance(error, lockkit.LockNotAvailable)
    assert lockkit.classify(error) is Failure.LOCK_TIMEOUT
    assert waited - 0.1 <= elapsed < waited + 3.0
    assert _read(target, LOCK_TIMEOUT) == before  # restored after the failure


@pytest.mark.parametrize("target", TARGETS)
def test_a_slow_statement_raises_statement_timeout_and_the_setting_is_restored(target: Target) -> None:
    connection = connections[target.alias]
    if connection.vendor == "mysql" and not connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        pytest.skip("max_execution_time on MySQL applies to SELECT only; this test uses MariaDB's variable")
    setting = {
        "postgresql": "SELECT current_setting('statement_timeout')",
        "mysql": "SELECT @@SESSION.max_statement_time",
    }
    before = _read(target, setting)
    with (
        pytest.raises(lockkit.StatementTimeout) as caught,
        lockkit.locked(target.alias, statement_timeout=0.2),
        connection.cursor() as cursor,
    ):
        cursor.execute({"postgresql": "SELECT pg_sleep(5)", "mysql": "SELECT SLEEP(5)"}[connection.vendor])
    assert caught.value.sqlstate == {"postgresql": "57014", "mysql": "1969"}[connection.vendor]
    assert _read(target, setting) == before


@pytest.mark.parametrize("target", TARGETS)
def test_a_nested_operation_makes_one_attempt_and_the_outer_transaction_goes_on(target: Target) -> None:
    row = Stock.objects.using(target.data).create(sku="widget", available=1)
    calls: list[int] = []
    events: list[RetryEvent] = []

    @lockkit.locked_operation(
        target.alias, lock_timeout=0.1, retry=RetryPolicy(attempts=5, before_retry=events.append)
    )
    def take() -> None:
        calls.append(lockkit.current_scope().attempt)
        lockkit.current_scope().get(Stock, pk="widget")

    with transaction.atomic(using=target.alias):
        Stock.objects.using(target.alias).create(sku="before", available=1)
        with hold_lock(row), pytest.raises(lockkit.LockTimeout) as caught:
            take()
        assert caught.value.attempts == 1
        # The failure rolled back the nested savepoint only: the outer transaction goes on.
        Stock.objects.using(target.alias).create(sku="after", available=2)
    assert calls == [1]
    assert events == []
    assert sorted(Stock.objects.using(target.data).values_list("sku", flat=True)) == [
        "after",
        "before",
        "widget",
    ]


@pytest.mark.parametrize("target", TARGETS)
def test_waiters_decide_on_the_value_committed_before_they_got_the_lock(target: Target) -> None:
    row = Stock.objects.using(target.data).create(sku="widget", available=10)
    pids: list[int] = []

    @lockkit.locked_operation(target.alias, lock_timeout=10)
    def buy(quantity: int) -> int:
        pids.append(backend_pid(target.alias))  # inside the transaction: the server session that will wait
        stock = lockkit.current_scope().get(Stock, pk="widget")
        if stock.available < quantity:
            raise InsufficientStock(f"{stock.available} < {quantity}")
        stock.available -= quantity
        stock.save(update_fields=["available"], using=target.alias)
        return stock.available

    with hold_lock(row) as holder:  # on the data alias: PgBouncer's waiters queue on its primary
        buyers = [in_thread(buy, 3) for _ in range(2)]
        assert sorted(wait_until_blocked(holder, count=2, contenders=buyers, timeout=JOIN)) == sorted(pids)
        assert not any(buyer.done() for buyer in buyers)  # still waiting while the row is held
        holder.run(lambda: Stock.objects.using(target.data).filter(pk="widget").update(available=5))
        holder.release(commit=True)
    outcomes = [buyer.outcome(timeout=JOIN) for buyer in buyers]
    # The first decided on the committed 5 (not the 10 it could have read), the second on the 2 it left.
    assert sorted((type(o.error).__name__, o.result) for o in outcomes) == [
        ("InsufficientStock", None),
        ("NoneType", 2),
    ]
    assert Stock.objects.using(target.data).get(pk="widget").available == 2


def _deadlock_pair(target: Target, retry: RetryPolicy | None) -> tuple[list[Any], list[RetryEvent]]:
    """Two transfers lock a,b and b,a, meeting at a barrier between the two locks on their first attempt."""
    for sku in ("a", "b"):
        Stock.objects.using(target.data).create(sku=sku, available=10)
    barrier = threading.Barrier(2)
    events: list[RetryEvent] = []
    if retry is not None:
        retry = RetryPolicy(attempts=retry.attempts, before_retry=events.append)

    @lockkit.locked_operation(target.alias, retry=retry, lock_timeout=10)
    def transfer(first: str, second: str) -> int:
        scope = lockkit.current_scope()
        scope.get(Stock, pk=first)
        if scope.attempt == 1:
            barrier.wait(JOIN)  # both hold their first row before either asks for the second
        scope.get(Stock, pk=second)
        Stock.objects.using(target.alias).filter(pk=first).update(available=F("available") - 1)
        Stock.objects.using(target.alias).filter(pk=second).update(available=F("available") + 1)
        return scope.attempt

    outcomes = run_concurrently(transfer, 2, args=[("a", "b"), ("b", "a")], timeout=JOIN)
    return [o.error if o.error is not None else o.result for o in outcomes], events


def _totals(target: Target) -> dict[str, int]:
    return dict(Stock.objects.using(target.data).values_list("sku", "available"))


@pytest.mark.parametrize("target", TARGETS)
def test_a_deadlock_is_retried_and_both_transfers_finish(target: Target) -> None:
    results, events = _deadlock_pair(target, RetryPolicy(attempts=5))
    assert all(isinstance(r, int) for r in results), results
    # One transfer is the victim and retries. Usually the other finishes on its first attempt, but on a loaded
    # machine the victim's retry can take its first row again before the survivor (woken from its wait) does,
    # and the two deadlock a second time (seen at load 16: results [2, 2], two deadlock events, both real in the
    # server log). What always holds: at least one retry, one more attempt per retry, both transfers applied.
    assert len(events) >= 1
    assert sum(results) == 2 + len(events)  # each retry was one more attempt of one transfer
    assert {(e.failure, e.sqlstate, e.alias) for e in events} == {
        (Failure.DEADLOCK_DETECTED, target.deadlock_code, target.alias)
    }
    assert _totals(target) == {"a": 10, "b": 10}  # both applied: a gave one and got one back


@pytest.mark.parametrize("target", TARGETS)
def test_a_deadlock_without_retry_raises_deadlock_detected_for_one(target: Target) -> None:
    results, _ = _deadlock_pair(target, None)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1, results
    assert isinstance(errors[0], lockkit.DeadlockDetected)
    assert (errors[0].sqlstate, errors[0].alias, errors[0].attempts) == (
        target.deadlock_code,
        target.alias,
        1,
    )
    assert 1 in results  # the survivor finished on its first attempt
    assert sorted(_totals(target).values()) == [9, 11]  # the survivor's transfer only


@pytest.mark.parametrize("target", TARGETS)
def test_concurrent_buyers_never_oversell(target: Target) -> None:
    Stock.objects.using(target.data).create(sku="widget", available=3)
    outcomes = run_concurrently(reserve_one_on(target.alias), 6, timeout=JOIN)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert sum(1 for o in outcomes if o.result) == 3
    assert Stock.objects.using(target.data).get(pk="widget").available == 0
