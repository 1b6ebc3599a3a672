"""lockkit.signals under real contention: a retried deadlock, a lock timeout given up, claims; none sent unobserved."""

from __future__ import annotations

from typing import Any

import pytest

import lockkit
from lockkit import Failure, events, signals
from lockkit.claims import claim_next, complete, heartbeat, reclaim_expired, release
from lockkit_tests.models import Job, Stock
from lockkit_tests.support.claims_helpers import expire
from lockkit_tests.support.observe_helpers import deadlock_pair, recording, timed_out_twice

pytestmark = pytest.mark.contention


def qualified(func: Any) -> str:
    """The name lockkit gives an operation: the function's module and qualified name."""
    return f"{func.__module__}.{func.__qualname__}"


def test_a_retried_deadlock_sends_each_signal_with_its_documented_arguments() -> None:
    with recording() as recorder:
        transfer, results = deadlock_pair()
    assert all(isinstance(r, int) for r in results), results
    attempts_run = sum(results)  # each transfer returns the attempt it finished on
    assert 1 in results
    assert attempts_run >= 3

    retried = recorder.of("operation_retried")
    assert len(retried) == attempts_run - 2  # one retry per extra attempt
    for sent in retried:
        assert set(sent) == {"operation", "alias", "attempt", "failure", "sqlstate", "wait", "error"}
        assert (sent["operation"], sent["alias"], sent["failure"], sent["sqlstate"]) == (
            qualified(transfer),
            "default",
            Failure.DEADLOCK_DETECTED,
            "40P01",
        )
        assert isinstance(sent["error"], lockkit.DeadlockDetected)
        assert 0.0 <= sent["wait"] <= 0.2
        assert sent["attempt"] >= 1
    assert recorder.of("operation_gave_up") == []

    finished = recorder.of("operation_finished")
    assert sorted(sent["attempts"] for sent in finished) == sorted(results)
    for sent in finished:
        assert set(sent) == {"operation", "alias", "attempts", "failure", "error", "duration"}
        assert (sent["failure"], sent["error"], sent["alias"]) == (None, None, "default")
        assert sent["duration"] > 0
    assert len(recorder.of("operation_started")) == 2
    # The sender of every operation signal is the decorated function.
    assert set(recorder.senders("operation_finished")) | set(recorder.senders("operation_retried")) == {
        transfer
    }

    attempts = recorder.of("attempt_finished")
    assert len(attempts) == len(recorder.of("attempt_started")) == attempts_run
    failed = [sent for sent in attempts if sent["error"] is not None]
    assert len(failed) == attempts_run - 2
    assert {sent["failure"] for sent in failed} == {Failure.DEADLOCK_DETECTED}

    locks = recorder.of("lock_acquired")
    # Every attempt locked its first row; the two that finished locked their second row too.
    assert len(locks) == attempts_run + 2
    for sent in locks:
        assert set(sent) == {"alias", "scope", "model", "rows", "wait"}
        assert (sent["alias"], sent["model"], sent["rows"]) == ("default", Stock, 1)
        assert sent["wait"] >= 0
    # The victim's second lock waited for the survivor's commit: a deadlock is detected after 100 ms here.
    assert max(sent["wait"] for sent in locks) >= 0.05


def test_a_lock_timeout_given_up_sends_retried_gave_up_and_finished_with_the_failure() -> None:
    with recording() as recorder:
        take, error = timed_out_twice()
    assert isinstance(error, lockkit.LockTimeout)
    assert error.attempts == 2

    (retried,) = recorder.of("operation_retried")
    assert (retried["attempt"], retried["failure"], retried["sqlstate"]) == (1, Failure.LOCK_TIMEOUT, "55P03")
    (gave_up,) = recorder.of("operation_gave_up")
    assert gave_up == {
        "operation": qualified(take),
        "alias": "default",
        "attempts": 2,
        "failure": Failure.LOCK_TIMEOUT,
        "sqlstate": "55P03",
        "error": error,
    }
    (finished,) = recorder.of("operation_finished")
    assert (finished["attempts"], finished["failure"], finished["error"]) == (2, Failure.LOCK_TIMEOUT, error)
    assert finished["duration"] >= 0.4  # two waits of lock_timeout=0.2
    assert [(s["attempt"], s["failure"]) for s in recorder.of("attempt_finished")] == [
        (1, Failure.LOCK_TIMEOUT),
        (2, Failure.LOCK_TIMEOUT),
    ]
    assert recorder.of("lock_acquired") == []  # no lock was acquired


@pytest.mark.django_db(transaction=True)
def test_an_application_error_finishes_without_a_failure_kind() -> None:
    Stock.objects.create(sku="s", available=0)

    @lockkit.locked_operation
    def reserve(sku: str) -> None:
        lockkit.current_scope().get(Stock, pk=sku)
        raise ValueError("insufficient")

    @lockkit.locked_operation
    def other() -> int:
        return 1

    only_reserve: list[str] = []

    def on_reserve(sender: object, *, operation: str, **kwargs: Any) -> None:
        only_reserve.append(operation)

    signals.operation_finished.connect(on_reserve, sender=reserve)
    try:
        with recording() as recorder:
            with pytest.raises(ValueError, match="insufficient"):
                reserve("s")
            assert other() == 1
    finally:
        signals.operation_finished.disconnect(on_reserve, sender=reserve)
    first, second = recorder.of("operation_finished")
    assert (first["attempts"], first["failure"], type(first["error"])) == (1, None, ValueError)
    assert (second["operation"], second["error"]) == (qualified(other), None)
    assert recorder.of("operation_retried") == []
    assert only_reserve == [qualified(reserve)]  # a receiver connected with sender= hears one operation


@pytest.mark.django_db(transaction=True)
def test_lock_all_and_advisory_locks_send_lock_acquired_with_rows() -> None:
    Stock.objects.bulk_create([Stock(sku=f"s{i}", available=i) for i in range(3)])
    with recording() as recorder, lockkit.locked() as scope:
        scope.lock_all(Stock, pks=["s0", "s2"])
        scope.advisory_lock("observe")
    assert [(s["model"], s["rows"]) for s in recorder.of("lock_acquired")] == [(Stock, 2), (None, 1)]
    assert recorder.of("operation_finished") == []  # a locked() scope is not an operation


@pytest.mark.django_db(transaction=True)
def test_claims_send_made_completed_released_reclaimed_and_stale() -> None:
    jobs = Job.objects.bulk_create([Job(name=f"j{i}") for i in range(3)])
    pending = Job.objects.filter(state="pending")
    with recording() as recorder:
        first, second, third = claim_next(pending, worker="w1", lease=30, limit=3, set={"state": "running"})
        complete(first, set={"state": "done"})
        release(second, set={"state": "pending"})
        expire(third.pk)
        assert reclaim_expired(Job.objects.all(), set={"state": "pending"}) == 1
        with pytest.raises(lockkit.StaleClaim) as stale:
            heartbeat(third)
        assert claim_next(Job.objects.filter(state="nothing"), worker="w1", lease=30) == []
    (made,) = recorder.of("claim_made")
    assert (made["model"], made["alias"], made["worker"]) == (Job, "default", "w1")
    assert [c.pk for c in made["claims"]] == [j.pk for j in jobs]
    assert [(s["claims"], s["model"]) for s in recorder.of("claim_completed")] == [([first], Job)]
    assert [s["claims"] for s in recorder.of("claim_released")] == [[second]]
    assert recorder.of("claim_reclaimed") == [{"model": Job, "alias": "default", "count": 1}]
    (stale_sent,) = recorder.of("claim_stale")
    assert (stale_sent["claims"], stale_sent["error"]) == ([third], stale.value)


@pytest.mark.django_db(transaction=True)
def test_without_receivers_nothing_is_observed_or_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("observation code ran without a receiver")

    monkeypatch.setattr(events, "ObservedOperation", refuse)
    monkeypatch.setattr(events, "timed_lock", refuse)
    assert not any(getattr(signals, name).receivers for name in signals.__all__)
    assert not events.observing()
    Stock.objects.create(sku="s", available=3)

    @lockkit.locked_operation
    def reserve(sku: str) -> int:
        scope = lockkit.current_scope()
        stock = scope.get(Stock, pk=sku)
        scope.lock_all(Stock)
        stock.available -= 1
        stock.save()
        return stock.available

    assert reserve("s") == 2


INSTALLED: list[str] = []


def install_for_test() -> None:
    INSTALLED.append("installed")


def test_observers_setting_runs_each_callable_when_the_app_is_ready() -> None:
    from django.apps import apps
    from django.test import override_settings

    config = apps.get_app_config("lockkit")
    INSTALLED.clear()
    with override_settings(
        LOCKKIT={"OBSERVERS": ["lockkit_tests.observability.test_signals.install_for_test"]}
    ):
        config.ready()
    assert INSTALLED == ["installed"]
    INSTALLED.clear()
    # A bad OBSERVERS never stops the app from loading: nothing is installed, the check reports it (E003) and
    # every locked call refuses it.
    with override_settings(
        LOCKKIT={"OBSERVERS": "lockkit_tests.observability.test_signals.install_for_test"}
    ):
        config.ready()
        with pytest.raises(TypeError, match="OBSERVERS"):
            lockkit.locked_operation(lambda: None)()
    assert INSTALLED == []
