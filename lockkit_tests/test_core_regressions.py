"""Regressions found by breaking lockkit on purpose: each failed before its fix."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from typing import Any

import pytest
import tenacity
from django.db import DatabaseError, OperationalError, connection, connections, transaction
from django.db.models import Count
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit import LockTimeout, RetryPolicy
from lockkit.testing import hold_lock
from lockkit_tests.models import RemoteItem, Stock
from lockkit_tests.util import show

pytestmark = pytest.mark.django_db(transaction=True)

FAST = RetryPolicy(attempts=3, wait_initial=0.001, wait_max=0.001)


def test_on_commit_callback_failure_never_reruns_committed_work() -> None:
    counter = Stock.objects.create(sku="counter", available=0)
    calls: list[int] = []

    def bump_counter() -> None:
        with lockkit.locked(lock_timeout=0.05) as scope:
            row = scope.get(Stock, pk="counter")
            row.available += 1
            row.save()

    @lockkit.locked_operation(retry=FAST)
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


def test_generator_functions_and_models_are_refused_at_decoration() -> None:
    def gen() -> Iterator[Any]:
        yield lockkit.current_scope()

    with pytest.raises(TypeError, match="generator"):
        lockkit.locked_operation(gen)
    with pytest.raises(TypeError, match="generator"):
        lockkit.locked()(gen)
    with pytest.raises(TypeError, match="model=Stock"):
        lockkit.locked(Stock)
    with pytest.raises(TypeError, match="model=Stock"):
        lockkit.locked_operation(Stock)


@pytest.mark.parametrize("value", [10**400, -(10**400)])
def test_huge_int_durations_name_the_parameter(value: int) -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        lockkit.locked(lock_timeout=value)
    with pytest.raises(ValueError, match="deadline"):
        RetryPolicy(deadline=value)


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_lock_all_with_a_queryset_of_pks_stays_on_the_scope_alias() -> None:
    Stock.objects.create(sku="a", available=1)
    with lockkit.locked("default") as scope:
        with CaptureQueriesContext(connections["other"]) as other:
            with pytest.raises(lockkit.AliasMismatch):
                scope.lock_all(Stock, pks=Stock.objects.using("other").values("pk"))
            rows = scope.lock_all(Stock, pks=Stock.objects.filter(available=1).values("pk"))
        assert len(other) == 0
    assert [r.sku for r in rows] == ["a"]


def test_on_commit_robust_must_be_a_bool() -> None:
    with lockkit.locked() as scope, pytest.raises(TypeError, match="robust"):
        scope.on_commit(lambda: None, robust="no")  # type: ignore[arg-type]


def test_long_exception_chains_are_still_classified() -> None:
    import psycopg

    exc: BaseException = psycopg.errors.DeadlockDetected("deadlock")
    for _ in range(20):
        try:
            raise RuntimeError("wrapped") from exc
        except RuntimeError as wrapped:
            exc = wrapped
    assert lockkit.classify(exc) is lockkit.Failure.DEADLOCK_DETECTED


def test_claim_next_refuses_aggregates_and_huge_limits_before_sql() -> None:
    from lockkit.claims import claim_next
    from lockkit_tests.models import Job

    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(ValueError, match="limit"):
            claim_next(Job.objects.all(), worker="w", lease=5, limit=10**20)
        with pytest.raises(ValueError, match="aggregate"):
            claim_next(Job.objects.annotate(n=Count("tags")).filter(n=0), worker="w", lease=5)
    assert len(queries) == 0


def test_bad_retry_setting_dict_names_the_setting(settings: Any) -> None:
    settings.LOCKKIT = {"RETRY": {"attempt": 5}}
    with pytest.raises(TypeError, match=r"LOCKKIT\['RETRY'\]"):
        lockkit.locked_operation(lambda: None)()
