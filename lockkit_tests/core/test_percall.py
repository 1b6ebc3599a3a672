"""What a locked operation does per call: settings read once per change, tenacity only after a retryable failure,
one clone of the caller's queryset."""

from __future__ import annotations

from typing import Any

import pytest
import tenacity
from django.db import IntegrityError, connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy, conf
from lockkit import retries as retry
from lockkit_tests.models import Stock
from lockkit_tests.support.util import raise_sqlstate, show

pytestmark = [pytest.mark.django_db(transaction=True)]


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads = [0]
    original = conf._user_settings

    def counted() -> dict[str, Any]:
        reads[0] += 1
        return original()

    monkeypatch.setattr(conf, "_user_settings", counted)
    return reads


def test_settings_are_read_once_until_override_settings_changes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(LOCKKIT={"LOCK_TIMEOUT": 0.75}):
        reads = _count_reads(monkeypatch)
        for _ in range(3):
            with lockkit.locked():
                assert show("lock_timeout") == "750ms"
        # LOCK_TIMEOUT, STATEMENT_TIMEOUT and RETRY (as entering retries it, and as a lost COMMIT is resolved for
        # its reconnect_within) read and validated once each, then cached: not once more per call.
        assert reads == [4]
        with override_settings(LOCKKIT={"LOCK_TIMEOUT": 2, "STATEMENT_TIMEOUT": 9}), lockkit.locked():
            assert (show("lock_timeout"), show("statement_timeout")) == ("2s", "9s")
        with lockkit.locked():  # the override ended: the enclosing value is read again
            assert (show("lock_timeout"), show("statement_timeout")) == ("750ms", "0")


def test_settings_fixture_changes_are_seen_too(settings: Any) -> None:
    settings.LOCKKIT = {"LOCK_TIMEOUT": 0.5}
    with lockkit.locked():
        assert show("lock_timeout") == "500ms"
    settings.LOCKKIT = {"LOCK_TIMEOUT": 0.25}
    with lockkit.locked():
        assert show("lock_timeout") == "250ms"


def test_a_bad_setting_raises_on_every_call_and_is_never_cached() -> None:
    with override_settings(LOCKKIT={"RETRY": 3}):
        for _ in range(2):
            with pytest.raises(TypeError, match=r"LOCKKIT\['RETRY'\]"):
                lockkit.locked_operation(lambda: None)()
    with override_settings(LOCKKIT={"LOCK_TIMEOUT": "5"}):
        for _ in range(2):
            with CaptureQueriesContext(connection) as queries, pytest.raises(TypeError, match="LOCK_TIMEOUT"):
                with lockkit.locked():
                    pass  # pragma: no cover - refused on entry
            assert queries.captured_queries == []


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    builds = [0]
    original = retry.build_retrying

    def counted(*args: Any, **kwargs: Any) -> tenacity.Retrying:
        builds[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(retry, "build_retrying", counted)
    return builds


def test_a_call_that_succeeds_builds_no_retrying(monkeypatch: pytest.MonkeyPatch) -> None:
    builds = _count_builds(monkeypatch)
    Stock.objects.create(sku="s", available=3)

    @lockkit.locked_operation
    def take() -> int:
        stock = lockkit.current_scope().get(Stock, sku="s")
        stock.available -= 1
        stock.save(update_fields=["available"])
        return stock.available

    assert [take(), take()] == [2, 1]
    assert builds == [0]

    @lockkit.locked_operation
    def refuse() -> None:
        raise_sqlstate("23505")  # a unique violation: not a failure any policy retries

    with pytest.raises(IntegrityError) as info:
        refuse()
    assert info.value.__cause__.sqlstate == "23505"  # type: ignore[union-attr]
    assert builds == [0]


def test_a_retried_failure_is_tenacitys_attempt_one(monkeypatch: pytest.MonkeyPatch) -> None:
    builds = _count_builds(monkeypatch)
    events: list[RetryEvent] = []
    attempts: list[int] = []

    @lockkit.locked_operation(retry=RetryPolicy(attempts=3, wait_initial=0.001, before_retry=events.append))
    def flaky() -> str:
        attempts.append(lockkit.current_scope().attempt)
        if len(attempts) < 3:
            raise_sqlstate("40P01")
        return "done"

    assert flaky() == "done"
    assert attempts == [1, 2, 3]
    assert [(e.attempt, e.failure, e.sqlstate) for e in events] == [
        (1, Failure.DEADLOCK_DETECTED, "40P01"),
        (2, Failure.DEADLOCK_DETECTED, "40P01"),
    ]
    assert builds == [1]


def test_give_up_counts_the_first_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    given_up: list[RetryEvent] = []

    @lockkit.locked_operation(retry=RetryPolicy(attempts=2, wait_initial=0.001, on_give_up=given_up.append))
    def always() -> None:
        raise_sqlstate("40001")

    with pytest.raises(lockkit.SerializationFailure) as info:
        always()
    assert info.value.attempts == 2
    assert [(e.attempt, e.failure) for e in given_up] == [(2, Failure.SERIALIZATION_FAILURE)]


def test_the_deadline_counts_the_first_attempt() -> None:
    given_up: list[RetryEvent] = []
    attempts: list[int] = []

    @lockkit.locked_operation(
        retry=RetryPolicy(attempts=5, wait_initial=0.001, deadline=0.2, on_give_up=given_up.append)
    )
    def slow_then_deadlock() -> None:
        attempts.append(lockkit.current_scope().attempt)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(0.3)")  # the first attempt alone outlasts the deadline
        raise_sqlstate("40P01")

    with pytest.raises(lockkit.DeadlockDetected) as info:
        slow_then_deadlock()
    assert attempts == [1]
    assert info.value.attempts == 1
    assert len(given_up) == 1


def test_lock_clones_the_callers_queryset_twice_at_most_and_leaves_it_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Stock.objects.create(sku="a", available=1)
    mine = Stock.objects.filter(sku="a")
    clones = [0]
    original = type(mine)._clone  # type: ignore[attr-defined]

    def counted(self: Any) -> Any:
        clones[0] += 1
        return original(self)

    with lockkit.locked() as scope:
        monkeypatch.setattr(type(mine), "_clone", counted)
        locked = scope.lock(mine)
        monkeypatch.undo()
        # select_for_update() and using(): one clone each. Binding the alias on the first clone would save one,
        # but only by writing the queryset's private _db (public APIs only).
        assert clones == [2]
        assert locked.db == "default"
        assert locked.query.select_for_update
        assert not mine.query.select_for_update
        assert mine._db is None  # type: ignore[attr-defined]
        assert [s.sku for s in locked] == ["a"]


def test_scope_options_are_validated_once_per_distinct_arguments() -> None:
    from lockkit.scopes.options import ScopeOptions

    first = ScopeOptions.build("default", lock_timeout=2, nowait=True)
    assert ScopeOptions.build("default", lock_timeout=2, nowait=True) is first
    assert ScopeOptions.build("default", lock_timeout=2.0, nowait=True) == first  # another type, same value
    for _ in range(2):  # a refusal is never cached
        with pytest.raises(ValueError, match="not a configured database alias"):
            lockkit.locked("nope")
        with pytest.raises(TypeError, match="lock_timeout"):
            lockkit.locked(lock_timeout=True)
    with pytest.raises(TypeError, match="using must be"):
        lockkit.locked(["default"])  # type: ignore[call-overload]  # unhashable: validated without the cache
