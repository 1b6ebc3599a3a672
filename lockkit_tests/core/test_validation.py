"""Bad inputs: each public parameter, wrong types and values, refused with a clear error before any SQL runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import tenacity
from django.db import connections
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit import Failure, RetryPolicy
from lockkit_tests.models import Stock


def _enter(**options: Any) -> Callable[[], Any]:
    def run() -> None:
        with lockkit.locked(**options):
            raise AssertionError("must not enter")

    return run


def _decorate(**options: Any) -> Callable[[], Any]:
    return lambda: lockkit.locked_operation(**options)(lambda: None)


BAD_DURATIONS: list[tuple[Any, type[Exception]]] = [
    (0, ValueError),
    (0.0, ValueError),
    (-1, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
    (-math.inf, ValueError),
    (timedelta(0), ValueError),
    (timedelta(seconds=-1), ValueError),
    (10**12, ValueError),
    (True, TypeError),
    (False, TypeError),
    ("5", TypeError),
    ("5s", TypeError),
    ([1], TypeError),
    (object(), TypeError),
]

CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = []
for factory_name, factory in (("locked", _enter), ("locked_operation", _decorate)):
    for name in ("lock_timeout", "statement_timeout"):
        for value, error in BAD_DURATIONS:
            CASES.append((f"{factory_name}-{name}={value!r}", factory(**{name: value}), error, name))
    for flag in ("nowait", "skip_locked", "no_key"):
        for value in (1, 0, "yes", None):
            CASES.append((f"{factory_name}-{flag}={value!r}", factory(**{flag: value}), TypeError, flag))
    CASES += [
        (
            f"{factory_name}-nowait+skip_locked",
            factory(nowait=True, skip_locked=True),
            ValueError,
            "skip_locked",
        ),
        (f"{factory_name}-using=unknown", factory(using="nowhere"), ValueError, "nowhere"),
        (f"{factory_name}-using=''", factory(using=""), ValueError, "using"),
        (f"{factory_name}-using=3", factory(using=3), TypeError, "using"),
        (f"{factory_name}-model=instance", factory(model=Stock(sku="x", available=1)), TypeError, "model"),
        (f"{factory_name}-model=str", factory(model="Stock"), TypeError, "model"),
        (f"{factory_name}-model=queryset", factory(model=Stock.objects.all()), TypeError, "model"),
    ]
CASES += [
    ("locked-using=callable-with-options", _enter(using=lambda: "default", nowait=True), TypeError, "using"),
    ("locked_operation-retry=3", _decorate(retry=3), TypeError, "retry"),
    ("locked_operation-retry=str", _decorate(retry="default"), TypeError, "retry"),
    ("locked_operation-retry=class", _decorate(retry=RetryPolicy), TypeError, "retry"),
    ("locked_operation-retry=dict-bad", _decorate(retry={"attempts": 0}), ValueError, "attempts"),
    ("RetryPolicy-attempts=0", lambda: RetryPolicy(attempts=0), ValueError, "attempts"),
    ("RetryPolicy-attempts=True", lambda: RetryPolicy(attempts=True), TypeError, "attempts"),
    ("RetryPolicy-attempts=2.5", lambda: RetryPolicy(attempts=2.5), TypeError, "attempts"),  # type: ignore[arg-type]
    ("RetryPolicy-wait_initial=0", lambda: RetryPolicy(wait_initial=0), ValueError, "wait_initial"),
    ("RetryPolicy-wait_max=nan", lambda: RetryPolicy(wait_max=math.nan), ValueError, "wait_max"),
    (
        "RetryPolicy-wait_max<initial",
        lambda: RetryPolicy(wait_initial=1, wait_max=0.5),
        ValueError,
        "wait_max",
    ),
    ("RetryPolicy-deadline=-1", lambda: RetryPolicy(deadline=-1), ValueError, "deadline"),
    ("RetryPolicy-deadline=True", lambda: RetryPolicy(deadline=True), TypeError, "deadline"),
    ("RetryPolicy-retry_on=str", lambda: RetryPolicy(retry_on="deadlock"), TypeError, "retry_on"),  # type: ignore[arg-type]
    ("RetryPolicy-retry_on=[str]", lambda: RetryPolicy(retry_on=["deadlock"]), TypeError, "retry_on"),  # type: ignore[list-item]
    ("RetryPolicy-retry_on=enum", lambda: RetryPolicy(retry_on=Failure.LOCK_TIMEOUT), TypeError, "retry_on"),  # type: ignore[arg-type]
    (
        "RetryPolicy-retry_on=read_only",
        lambda: RetryPolicy(retry_on={Failure.READ_ONLY}),
        ValueError,
        "retry_on",
    ),
    ("RetryPolicy-before_retry=1", lambda: RetryPolicy(before_retry=1), TypeError, "before_retry"),  # type: ignore[arg-type]
    ("locked_operation-async", lambda: lockkit.locked_operation(_async_function), TypeError, "async"),
    ("locked_operation()-async", lambda: lockkit.locked_operation()(_async_function), TypeError, "async"),
    ("locked-async", lambda: lockkit.locked()(_async_function), TypeError, "async"),
    ("locked_operation-not-callable", lambda: lockkit.locked_operation()(42), TypeError, "callable"),  # type: ignore[arg-type]
    (
        "locked_operation-using-twice",
        lambda: lockkit.locked_operation("default", using="other"),
        TypeError,
        "using",
    ),
]


async def _async_function() -> None:
    return None


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.parametrize(("call", "error", "mentions"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_before_sql(
    call: Callable[[], Any], error: type[Exception], mentions: str
) -> None:
    with (
        CaptureQueriesContext(connections["default"]) as default,
        CaptureQueriesContext(connections["other"]) as other,
        pytest.raises(error, match=mentions),
    ):
        call()
    assert len(default) == 0
    assert len(other) == 0
    assert not connections["default"].in_atomic_block


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("target", "error"),
    # An instance is accepted (its row), but not an unsaved one, even with its pk set.
    [(Stock(sku="x", available=1), ValueError), ("Stock", TypeError), (None, TypeError), ([1, 2], TypeError)],
)
def test_lock_helpers_refuse_bad_targets_before_sql(target: Any, error: type[Exception]) -> None:
    with lockkit.locked() as scope:
        with CaptureQueriesContext(connections["default"]) as queries, pytest.raises(error, match="target"):
            scope.lock(target)
        with pytest.raises(TypeError, match="func"):
            scope.on_commit(42)  # type: ignore[arg-type]
        assert len(queries) == 0


@pytest.mark.django_db(transaction=True)
def test_bad_settings_are_named() -> None:
    from django.test import override_settings

    with override_settings(LOCKKIT={"LOCK_TIMEOUT": "5"}), pytest.raises(TypeError, match="LOCK_TIMEOUT"):
        with lockkit.locked():
            pass
    with override_settings(LOCKKIT={"LOCK_TIMOUT": 5}), pytest.raises(ValueError, match="LOCK_TIMOUT"):
        with lockkit.locked():
            pass
    with override_settings(LOCKKIT={"RETRY": 3}), pytest.raises(TypeError, match="RETRY"):
        lockkit.locked_operation(lambda: None)()
    assert not connections["default"].in_atomic_block


def test_valid_inputs_are_accepted() -> None:
    lockkit.locked(lock_timeout=timedelta(seconds=2), statement_timeout=1, nowait=True)
    lockkit.locked(lock_timeout=None, skip_locked=True, no_key=True)
    lockkit.locked_operation(retry=None)
    lockkit.locked_operation(retry=tenacity.Retrying())
    lockkit.locked_operation(retry={"attempts": 5})  # type: ignore[call-overload]
    policy = RetryPolicy(retry_on=[Failure.DEADLOCK_DETECTED], deadline=timedelta(seconds=3))
    assert policy.retry_on == frozenset({Failure.DEADLOCK_DETECTED})
    assert policy.deadline == 3.0
    with pytest.raises(AttributeError):
        policy.attempts = 5  # type: ignore[misc]


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


def test_bad_retry_setting_dict_names_the_setting(settings: Any) -> None:
    settings.LOCKKIT = {"RETRY": {"attempt": 5}}
    with pytest.raises(TypeError, match=r"LOCKKIT\['RETRY'\]"):
        lockkit.locked_operation(lambda: None)()
