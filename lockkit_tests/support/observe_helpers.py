"""Helpers for the observability tests: a recorder connected to every lockkit signal, and two contended runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db.models import F
from django.dispatch import Signal

import lockkit
from lockkit import RetryPolicy, signals
from lockkit.testing import hold_lock, in_thread, run_concurrently, wait_until_blocked
from lockkit_tests.models import Stock

JOIN = 30.0
SIGNALS = {name: getattr(signals, name) for name in signals.__all__}


@dataclass
class Recorder:
    """Every signal sent while connected, as ``(name, sender, kwargs)``, from any thread."""

    sent: list[tuple[str, object, dict[str, Any]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, name: str) -> list[dict[str, Any]]:
        return [kwargs for sent_name, _, kwargs in self.sent if sent_name == name]

    def senders(self, name: str) -> list[object]:
        return [sender for sent_name, sender, _ in self.sent if sent_name == name]


@contextmanager
def recording() -> Iterator[Recorder]:
    recorder = Recorder()
    receivers: list[tuple[Signal, Any]] = []
    for name, signal in SIGNALS.items():

        def receiver(sender: object, *, _name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal")
            with recorder._lock:
                recorder.sent.append((_name, sender, kwargs))

        signal.connect(receiver, weak=False)
        receivers.append((signal, receiver))
    try:
        yield recorder
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)


def deadlock_pair(alias: str = "default") -> tuple[Any, list[Any]]:
    """Two transfers lock a,b and b,a, meeting at a barrier between the two locks on their first attempt.

    Returns the decorated function and each call's result (the attempt it finished on) or error.
    """
    for sku in ("a", "b"):
        Stock.objects.using(alias).create(sku=sku, available=10)
    barrier = threading.Barrier(2)

    @lockkit.locked_operation(alias, retry=RetryPolicy(attempts=5), lock_timeout=10)
    def transfer(first: str, second: str) -> int:
        scope = lockkit.current_scope()
        scope.get(Stock, pk=first)
        if scope.attempt == 1:
            barrier.wait(JOIN)  # both hold their first row before either asks for the second
        scope.get(Stock, pk=second)
        Stock.objects.using(alias).filter(pk=first).update(available=F("available") - 1)
        Stock.objects.using(alias).filter(pk=second).update(available=F("available") + 1)
        return scope.attempt

    outcomes = run_concurrently(transfer, 2, args=[("a", "b"), ("b", "a")], timeout=JOIN)
    return transfer, [o.error if o.error is not None else o.result for o in outcomes]


def timed_out_twice(alias: str = "default") -> tuple[Any, BaseException | None]:
    """An operation whose two attempts both wait 0.2 s for a row another session holds, then give up."""
    row = Stock.objects.using(alias).create(sku="held", available=1)

    @lockkit.locked_operation(alias, retry=RetryPolicy(attempts=2), lock_timeout=0.2)
    def take(sku: str) -> int:
        return lockkit.current_scope().get(Stock, pk=sku).available

    with hold_lock(row) as holder:
        call = in_thread(take, "held")
        wait_until_blocked(holder, contenders=call, timeout=JOIN)
        error: BaseException | None = None
        try:
            call.result(JOIN)
        except BaseException as exc:
            error = exc
    return take, error
