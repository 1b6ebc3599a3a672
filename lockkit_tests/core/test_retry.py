"""locked_operation on PostgreSQL: deadlocks, serialization failures, retries outside atomic only, logging."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import pytest
import tenacity
from django.db import connection, transaction

import lockkit
from lockkit import CommitOutcomeUnknown, Failure, LockTimeout, RetryEvent, RetryPolicy
from lockkit.retries import (
    DEFAULT_RETRY_ON,
    call_with_retry,
    from_settings,
    reconnect_budget,
    retrying_only,
)
from lockkit.testing import backend_pid, hold_lock, in_thread, run_concurrently, wait_until_blocked
from lockkit_tests.models import Stock
from lockkit_tests.support.util import InsufficientStock, raise_sqlstate, reserve, show

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.contention]

FAST = RetryPolicy(attempts=3, wait_initial=0.001, wait_max=0.001)


def test_lock_all_never_deadlocks() -> None:
    """A,B and B,A through lock_all: the second waits on the first (seen by the database), no deadlock, no retry."""
    Stock.objects.create(sku="A", available=10)
    Stock.objects.create(sku="B", available=10)
    first_locked, release = threading.Event(), threading.Event()
    pids: list[int] = []

    @lockkit.locked_operation(retry=None, lock_timeout=10)
    def transfer(source: str, target: str) -> list[str]:
        rows = {s.sku: s for s in lockkit.current_scope().lock_all(Stock, pks=[source, target])}
        if source == "A":
            pids.append(backend_pid())
            first_locked.set()
            assert release.wait(10)
        rows[source].available -= 1
        rows[target].available += 1
        for row in rows.values():
            row.save(update_fields=["available"])
        return list(rows)

    first = in_thread(transfer, "A", "B")
    assert first_locked.wait(10)
    second = in_thread(transfer, "B", "A")
    assert (
        len(wait_until_blocked(pids[0], contenders=second, timeout=10)) == 1
    )  # B,A waits on A,B's lock of A
    release.set()
    results = {"A": first.result(timeout=15), "B": second.result(timeout=15)}
    # Neither failed; rows come back in the order asked (B,A really waited on row A: locked in key order).
    assert results == {"A": ["A", "B"], "B": ["B", "A"]}
    assert dict(Stock.objects.values_list("sku", "available")) == {"A": 10, "B": 10}


@pytest.mark.django_db(transaction=True, databases=["default", "serializable"])
def test_serialization_failure_is_retried_to_success() -> None:
    Stock.objects.create(sku="s", available=0)
    read_done, first_committed_update = threading.Event(), threading.Event()
    calls: list[int] = []
    events: list[RetryEvent] = []

    @lockkit.locked_operation("serializable", retry=RetryPolicy(before_retry=events.append))
    def increment() -> int:
        scope = lockkit.current_scope()
        calls.append(scope.attempt)
        stock = Stock.objects.using("serializable").get(sku="s")  # a plain read: the snapshot is taken
        if scope.attempt == 1:
            read_done.set()
            assert first_committed_update.wait(10)
        stock.available += 1
        stock.save(update_fields=["available"], using="serializable")
        return stock.available

    incrementing = in_thread(increment)
    assert read_done.wait(10)
    with lockkit.locked("serializable"):
        stock = Stock.objects.using("serializable").get(sku="s")
        stock.available += 10
        stock.save(update_fields=["available"], using="serializable")
    first_committed_update.set()
    value = incrementing.result(timeout=20)
    assert calls == [1, 2]
    assert [e.failure for e in events] == [Failure.SERIALIZATION_FAILURE]
    assert events[0].sqlstate == "40001"
    assert value == 11
    assert Stock.objects.get(sku="s").available == 11


def test_serialization_failure_without_retry_is_classified() -> None:
    @lockkit.locked_operation(retry=None)
    def fail() -> None:
        raise_sqlstate("40001")

    with pytest.raises(lockkit.SerializationFailure) as info:
        fail()
    assert info.value.sqlstate == "40001"
    assert info.value.attempts == 1


def test_outermost_operation_retries_lock_timeout_then_gives_up(caplog: pytest.LogCaptureFixture) -> None:
    stock = Stock.objects.create(sku="a", available=1)
    calls: list[int] = []
    give_ups: list[RetryEvent] = []

    @lockkit.locked_operation(lock_timeout=0.05, retry=RetryPolicy(attempts=3, on_give_up=give_ups.append))
    def take() -> None:
        calls.append(lockkit.current_scope().attempt)
        lockkit.current_scope().get(Stock, sku="a")

    caplog.set_level(logging.INFO, logger="lockkit")
    with hold_lock(stock), pytest.raises(lockkit.LockTimeout) as info:
        take()
    assert calls == [1, 2, 3]
    assert info.value.attempts == 3
    assert not isinstance(info.value, tenacity.RetryError)
    assert [(e.attempt, e.failure) for e in give_ups] == [(3, Failure.LOCK_TIMEOUT)]
    retries = [r for r in caplog.records if r.levelno == logging.INFO]
    gave_up = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.attempt for r in retries] == [1, 2]  # type: ignore[attr-defined]
    for record in retries:
        assert record.alias == "default"  # type: ignore[attr-defined]
        assert record.failure == "lock_timeout"  # type: ignore[attr-defined]
        assert record.sqlstate == "55P03"  # type: ignore[attr-defined]
        assert 0.0 <= record.wait <= 0.2  # type: ignore[attr-defined]
    assert len(gave_up) == 1
    assert gave_up[0].attempt == 3  # type: ignore[attr-defined]


def test_nowait_is_not_retried_by_default() -> None:
    stock = Stock.objects.create(sku="a", available=1)
    calls: list[int] = []

    @lockkit.locked_operation(nowait=True)
    def take() -> None:
        calls.append(1)
        lockkit.current_scope().get(Stock, sku="a")

    with hold_lock(stock), pytest.raises(lockkit.LockNotAvailable):
        take()
    assert calls == [1]


def test_on_commit_of_failed_attempt_never_runs() -> None:
    ran: list[int] = []

    @lockkit.locked_operation
    def work() -> int:
        scope = lockkit.current_scope()
        attempt = scope.attempt
        scope.on_commit(lambda: ran.append(attempt))
        if attempt == 1:
            raise_sqlstate("40P01")  # a real deadlock_detected from the server
        return attempt

    assert work() == 2
    assert ran == [2]


def test_tenacity_retrying_is_accepted_and_copied() -> None:
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(4),
        retry=tenacity.retry_if_exception_type(lockkit.SerializationFailure),
        wait=tenacity.wait_none(),
    )
    calls: list[int] = []

    @lockkit.locked_operation(retry=retrying)
    def flaky() -> int:
        calls.append(lockkit.current_scope().attempt)
        if len(calls) < 3:
            raise_sqlstate("40001")
        return len(calls)

    assert flaky() == 3
    assert calls == [1, 2, 3]
    assert retrying.statistics == {}  # the shared object itself never ran


def test_retry_default_comes_from_settings(settings: Any) -> None:
    calls: list[int] = []

    @lockkit.locked_operation
    def fail() -> None:
        calls.append(1)
        raise_sqlstate("40001")

    settings.LOCKKIT = {"RETRY": None}
    with pytest.raises(lockkit.SerializationFailure):
        fail()
    assert calls == [1]
    settings.LOCKKIT = {"RETRY": {"attempts": 2, "wait_initial": 0.001}}
    with pytest.raises(lockkit.SerializationFailure) as info:
        fail()
    assert calls == [1, 1, 1]
    assert info.value.attempts == 2


def test_read_only_is_never_retried() -> None:
    calls: list[int] = []

    @lockkit.locked_operation
    def write() -> None:
        calls.append(1)
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION READ ONLY")
        lockkit.current_scope().lock_all(Stock)

    with pytest.raises(lockkit.ReadOnlyDatabase) as info:
        write()
    assert info.value.sqlstate == "25006"
    assert calls == [1]


def test_unknown_errors_pass_through_unchanged() -> None:
    @lockkit.locked_operation
    def broken() -> None:
        raise_sqlstate("22012")  # division_by_zero: not a locking failure

    from django.db import DataError

    with pytest.raises(DataError) as info:
        broken()
    assert not isinstance(info.value, lockkit.LockError)


def test_stock_reservation_under_contention_never_oversells() -> None:
    Stock.objects.create(sku="hot", available=100)
    rng = random.Random(7)
    plans = [tuple(rng.randint(1, 3) for _ in range(25)) for _ in range(8)]

    def shopper(quantities: tuple[int, ...]) -> tuple[int, int]:
        reserved = refused = 0
        for quantity in quantities:
            try:
                reserve("hot", quantity)
            except InsufficientStock:
                refused += 1
            else:
                reserved += quantity
        return reserved, refused

    outcomes = run_concurrently(shopper, 8, args=[(p,) for p in plans], timeout=120)
    errors = [o.error for o in outcomes if o.error is not None]
    assert errors == []  # every refusal was the domain's InsufficientStock, never a database error
    reserved = sum(o.result[0] for o in outcomes if o.result)
    refused = sum(o.result[1] for o in outcomes if o.result)
    remaining = Stock.objects.get(sku="hot").available
    assert reserved + remaining == 100
    assert (
        0 <= remaining < 3
    )  # demand (~400 units) exceeded stock, so it was drained to below the largest ask
    assert refused > 0


def test_nested_operation_failure_retries_the_outer_operation_as_a_whole() -> None:
    Stock.objects.create(sku="n", available=0)
    inner_calls: list[int] = []
    outer_calls: list[int] = []

    @lockkit.locked_operation
    def inner() -> None:
        inner_calls.append(lockkit.current_scope().attempt)
        if len(outer_calls) == 1:
            raise_sqlstate("40P01")

    @lockkit.locked_operation(retry=RetryPolicy(attempts=3, wait_initial=0.001))
    def outer() -> int:
        outer_calls.append(lockkit.current_scope().attempt)
        Stock.objects.filter(sku="n").update(available=len(outer_calls))
        inner()
        return len(outer_calls)

    assert outer() == 2
    assert outer_calls == [1, 2]
    assert inner_calls == [1, 1]  # the nested call never retried on its own
    assert Stock.objects.get(sku="n").available == 2  # the first attempt's write was rolled back with it


def test_manual_transaction_counts_as_nested_no_retry_no_leak() -> None:
    stock = Stock.objects.create(sku="m", available=1)
    calls: list[int] = []

    @lockkit.locked_operation(lock_timeout=0.05, retry=FAST)
    def op() -> None:
        calls.append(1)
        lockkit.current_scope().get(Stock, pk="m")

    with hold_lock(stock):
        transaction.set_autocommit(False)
        try:
            with pytest.raises(LockTimeout):
                op()
            with lockkit.locked(lock_timeout=0.25) as scope:
                assert scope.nested
            after = show("lock_timeout")
        finally:
            transaction.rollback()
            transaction.set_autocommit(True)
    assert calls == [1]
    assert after == "0"


def test_tenacity_retry_error_callback_value_is_returned() -> None:
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(2),
        wait=tenacity.wait_none(),
        retry=tenacity.retry_if_exception_type(LockTimeout),
        retry_error_callback=lambda state: "fallback",
    )
    calls: list[int] = []

    @lockkit.locked_operation(retry=retrying)
    def op() -> str:
        calls.append(lockkit.current_scope().attempt)
        raise LockTimeout("x", alias="default")

    assert op() == "fallback"
    assert calls == [1, 2]


@pytest.mark.parametrize(
    ("raised", "calls_made"),
    [
        (lambda: LockTimeout("x", alias="default"), 3),  # classified, retried by the user's predicate
        (lambda: ValueError("the function's own"), 1),  # tenacity's default retries any Exception: not this
        (lambda: CommitOutcomeUnknown("lost", alias="default"), 1),  # may have committed: never
    ],
)
def test_a_tenacity_retrying_with_its_default_predicate_retries_only_classified_errors(
    raised: Any, calls_made: int
) -> None:
    """``Retrying(stop=...)`` alone retries every exception: lockkit narrows it, or a committed write ran twice."""
    retrying = tenacity.Retrying(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_none())
    calls: list[int] = []

    @lockkit.locked_operation(retry=retrying)
    def op() -> None:
        calls.append(lockkit.current_scope().attempt)
        raise raised()

    with pytest.raises(type(raised())):
        op()
    assert calls == list(range(1, calls_made + 1))


def test_tenacity_result_predicate_retries() -> None:
    calls: list[int] = []
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_none(),
        retry=tenacity.retry_if_result(lambda value: value is None),
    )

    @lockkit.locked_operation(retry=retrying)
    def op() -> str | None:
        calls.append(lockkit.current_scope().attempt)
        return None if len(calls) < 2 else "ok"

    assert op() == "ok"
    assert calls == [1, 2]


# -- how a RetryPolicy builds its tenacity Retrying (no database: the attempts raise lockkit's errors) ----------


def _stops(stop: object) -> list[object]:
    """The stop conditions a ``|`` combination holds, flattened."""
    if isinstance(stop, tenacity.stop.stop_any):
        return [inner for each in stop.stops for inner in _stops(each)]
    return [stop]


def test_the_policy_retrying_is_composed_of_tenacity_strategies() -> None:
    retrying = RetryPolicy(deadline=2.0).retrying(spent=0.5)
    assert isinstance(retrying.stop, tenacity.stop.stop_any)  # built with |
    stops = _stops(retrying.stop)
    assert len(stops) == 3
    assert all(isinstance(stop, tenacity.stop.stop_base) for stop in stops)
    (deadline,) = [stop for stop in stops if isinstance(stop, tenacity.stop_before_delay)]
    assert deadline.max_delay == pytest.approx(1.5)  # the deadline less what the first attempt spent
    assert isinstance(retrying.wait, tenacity.wait.wait_combine)  # built with +
    assert all(isinstance(wait, tenacity.wait.wait_base) for wait in retrying.wait.wait_funcs)
    assert isinstance(retrying.retry, tenacity.retry_base)
    assert retrying.reraise
    without_deadline = RetryPolicy().retrying()
    assert len(_stops(without_deadline.stop)) == 2
    assert not any(isinstance(stop, tenacity.stop_before_delay) for stop in _stops(without_deadline.stop))
    assert RetryPolicy().retrying().stop is not without_deadline.stop  # per call: nothing shared


def _failing(kinds: list[type[lockkit.LockError]], calls: list[int]) -> Any:
    """An attempt that raises ``kinds`` in turn (the last one for ever after)."""

    def attempt(number: int) -> None:
        calls.append(number)
        raise kinds[min(len(calls), len(kinds)) - 1]("injected", alias="default")

    return attempt


def test_lost_connections_do_not_count_against_attempts() -> None:
    events: list[RetryEvent] = []
    given_up: list[RetryEvent] = []
    policy = RetryPolicy(
        attempts=2, wait_initial=0.001, before_retry=events.append, on_give_up=given_up.append
    )
    lost, deadlock = lockkit.ConnectionLost, lockkit.DeadlockDetected
    calls: list[int] = []
    with pytest.raises(lockkit.DeadlockDetected) as info:  # the last classified error, never RetryError
        call_with_retry(
            policy, _failing([lost, lost, deadlock, lost, deadlock], calls), alias="default", operation="x"
        )
    assert calls == [1, 2, 3, 4, 5]  # two locking failures (attempts=2), three losses in between
    assert info.value.attempts == 5
    assert [event.failure for event in events] == [
        Failure.CONNECTION_LOST,
        Failure.CONNECTION_LOST,
        Failure.DEADLOCK_DETECTED,
        Failure.CONNECTION_LOST,
    ]
    assert [(event.attempt, event.failure) for event in given_up] == [(5, Failure.DEADLOCK_DETECTED)]
    # Waits: equal jitter after the n-th loss in a row (half of the cap fixed), full jitter after a failure.
    first, second, failure, again = (event.wait for event in events)
    assert 0.025 <= first <= 0.05
    assert 0.05 <= second <= 0.1
    assert 0 <= failure <= 0.001
    assert 0.025 <= again <= 0.05  # the losses in a row start again from the first wait


def test_lost_connections_are_retried_for_reconnect_within_from_the_first_loss() -> None:
    events: list[RetryEvent] = []
    policy = RetryPolicy(attempts=1, reconnect_within=0.4, before_retry=events.append)
    calls: list[int] = []
    started = time.monotonic()
    with pytest.raises(lockkit.ConnectionLost) as info:
        call_with_retry(policy, _failing([lockkit.ConnectionLost], calls), alias="default", operation="x")
    took = time.monotonic() - started
    assert 0.4 <= took < 0.4 + 0.5 + 0.3  # the budget, at most one more wait (0.5 s at most), some slack
    assert len(calls) >= 3
    assert info.value.attempts == len(calls)
    assert len(events) == len(calls) - 1
    caps = [min(0.5, 0.05 * 2 ** (n - 1)) for n in range(1, len(events) + 1)]
    assert all(cap / 2 <= event.wait <= cap for event, cap in zip(events, caps, strict=True))


def test_a_deadline_stops_losses_and_failures_alike() -> None:
    policy = RetryPolicy(attempts=100, wait_initial=0.01, wait_max=0.01, reconnect_within=30, deadline=0.3)
    calls: list[int] = []
    started = time.monotonic()
    with pytest.raises(lockkit.ConnectionLost):
        call_with_retry(
            policy,
            _failing([lockkit.DeadlockDetected, lockkit.ConnectionLost], calls),
            alias="default",
            operation="x",
        )
    assert time.monotonic() - started < 0.3 + 0.5 + 0.3
    assert len(calls) >= 2


def test_commit_outcome_unknown_and_unlisted_kinds_are_never_retried() -> None:
    for kind in (lockkit.CommitOutcomeUnknown, lockkit.LockNotAvailable):
        calls: list[int] = []
        with pytest.raises(kind):
            call_with_retry(RetryPolicy(), _failing([kind], calls), alias="default", operation="x")
        assert calls == [1]


def test_copy_makes_a_validated_variant() -> None:
    policy = RetryPolicy(attempts=5, reconnect_within=30)
    narrowed = policy.copy(retry_on={Failure.DEADLOCK_DETECTED})
    assert narrowed == RetryPolicy(attempts=5, reconnect_within=30, retry_on={Failure.DEADLOCK_DETECTED})
    assert policy.retry_on == frozenset(DEFAULT_RETRY_ON)  # unchanged: a frozen value
    with pytest.raises(ValueError, match="attempts"):
        policy.copy(attempts=0)
    with pytest.raises(TypeError):
        policy.copy(tries=2)


def test_retrying_only_keeps_a_settings_budget_with_an_entry_points_kinds() -> None:
    kinds = {Failure.CONNECTION_LOST}
    assert retrying_only(None, kinds) is None
    policy = RetryPolicy(attempts=4, reconnect_within=12)
    assert retrying_only(policy, kinds) == policy.copy(retry_on=kinds)
    user = tenacity.Retrying(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_none())
    narrowed = retrying_only(user, kinds)
    assert isinstance(narrowed, tenacity.Retrying)
    assert narrowed is not user
    assert narrowed.stop is user.stop
    assert narrowed.wait is user.wait
    calls: list[int] = []
    with pytest.raises(lockkit.DeadlockDetected):  # not a kind the entry point retries
        call_with_retry(narrowed, _failing([lockkit.DeadlockDetected], calls), alias="default", operation="x")
    assert calls == [1]
    with pytest.raises(lockkit.ConnectionLost):  # retried, within the user's own stop
        call_with_retry(
            narrowed, _failing([lockkit.ConnectionLost], calls := []), alias="default", operation="x"
        )
    assert calls == [1, 2, 3]


def test_from_settings_is_read_per_call_and_kept_until_the_settings_change(settings: Any) -> None:
    settings.LOCKKIT = {"RETRY": {"reconnect_within": 30}}
    claims = from_settings(retry_on={Failure.CONNECTION_LOST})
    assert claims == RetryPolicy(reconnect_within=30, retry_on={Failure.CONNECTION_LOST})
    assert from_settings(retry_on={Failure.CONNECTION_LOST}) is claims  # validated once
    assert from_settings() == RetryPolicy(reconnect_within=30)
    assert reconnect_budget(claims) == 30.0
    settings.LOCKKIT = {"RETRY": None}
    assert from_settings(retry_on={Failure.CONNECTION_LOST}) is None
    assert reconnect_budget(None) == 5.0
    settings.LOCKKIT = {}
    assert from_settings() == RetryPolicy()
