"""The hot path with and without observers: ``python -m benchmarks.observers [--database-url URL]``.

One process reserves uncontended rows with a ``locked_operation`` (``lockkit.current_scope().get()``, an update, a
commit), in paired alternating rounds: every round runs each configuration once, in a rotating order, on the same
warm connection: no receiver at all, one no-op receiver on ``operation_finished``, the Prometheus exporter
(``lockkit.contrib.prometheus``, its own registry) and the OpenTelemetry exporter (``lockkit.contrib.otel`` on an
SDK tracer provider without an exporter: spans are made and dropped). It prints each configuration's median wall
time and client CPU time (``time.process_time``: lockkit's and the observers' own work, without the waits for the
server, which a loaded machine makes noisy) per operation, and the medians of their per-round ratios to the round's
unobserved run. A second table isolates the
observation code itself, without any database work: the same lifecycle calls (``events.observing()``, then an
observed operation with one attempt that takes one lock, sent to each configuration's receivers) in a tight loop. Needs the ``bench`` and
``dev`` extras (prometheus-client, opentelemetry-sdk). Figures: docs/observability.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

CONFIGS = ("none", "signal", "prometheus", "otel")


def _install(config: str) -> Callable[[], None]:
    """Install ``config``'s observer; return what uninstalls it."""
    from lockkit import signals

    if config == "none":
        return lambda: None
    if config == "signal":

        def receiver(sender: object, **kwargs: Any) -> None:
            pass

        signals.operation_finished.connect(receiver, weak=False)

        def disconnect() -> None:
            signals.operation_finished.disconnect(receiver)

        return disconnect
    if config == "prometheus":
        from prometheus_client import CollectorRegistry

        from lockkit.contrib import prometheus

        return prometheus.install(CollectorRegistry()).uninstall
    from opentelemetry.sdk.trace import TracerProvider

    from lockkit.contrib import otel

    return otel.install(tracer_provider=TracerProvider()).uninstall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.observers", description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("LOCKKIT_BENCH_DATABASE_URL", ""))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--ops", type=int, default=100, help="operations per configuration per round")
    args = parser.parse_args(argv)

    from benchmarks.dbserver import target

    os.environ["LOCKKIT_BENCH_DATABASE_URL"] = target(args.database_url or None).url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    import lockkit
    from benchmarks import schema
    from benchmarks.models import Item
    from benchmarks.ops import ROWS

    schema.create()

    @lockkit.locked_operation(lock_timeout=5)
    def reserve(pk: int) -> None:
        item = lockkit.current_scope().get(Item, pk=pk)
        item.available -= 1
        item.reserved += 1
        item.save(update_fields=["available", "reserved"])

    wall: dict[str, list[float]] = {config: [] for config in CONFIGS}
    cpu: dict[str, list[float]] = {config: [] for config in CONFIGS}
    for pk in range(1, 201):  # warm the connection, the plan cache and lockkit's caches
        reserve(pk)
    for number in range(args.rounds):
        shift = number % len(CONFIGS)
        order = CONFIGS[shift:] + CONFIGS[:shift]
        for config in order:
            uninstall = _install(config)
            try:
                started, started_cpu = time.perf_counter(), time.process_time()
                for i in range(args.ops):
                    reserve(1 + (i % ROWS))
                wall[config].append((time.perf_counter() - started) / args.ops)
                cpu[config].append((time.process_time() - started_cpu) / args.ops)
            finally:
                uninstall()
    print(f"{args.rounds} rounds x {args.ops} uncontended reservations per configuration, alternating order")
    print(
        f"{'configuration':<12} {'wall/op':>10} {'ratio':>7} {'client CPU/op':>14} {'ratio':>7}"
        "  (medians; ratios: median of per-round ratios to none)"
    )
    for config in CONFIGS:
        wall_ratio = statistics.median(w / n for w, n in zip(wall[config], wall["none"], strict=True))
        cpu_ratio = statistics.median(c / n for c, n in zip(cpu[config], cpu["none"], strict=True))
        print(
            f"{config:<12} {statistics.median(wall[config]) * 1e6:>7.0f} us {wall_ratio:>7.3f}"
            f" {statistics.median(cpu[config]) * 1e6:>11.0f} us {cpu_ratio:>7.3f}"
        )
    _without_database(CONFIGS)
    return 0


def _without_database(configs: tuple[str, ...], calls: int = 20000, rounds: int = 5) -> None:
    """The observation code alone: what one call costs each configuration, in microseconds of CPU."""
    from types import SimpleNamespace

    from benchmarks.models import Item
    from lockkit import LockScope, events, signals

    scope = SimpleNamespace(alias="default")

    def locked_row() -> int:
        return 1

    def attempt(alias: str, number: int, args: Any, kwargs: Any) -> int:
        # What scope.get() adds: one locking statement, timed only when lock_acquired has receivers.
        if not signals.lock_acquired.receivers:
            return locked_row()
        return events.timed_lock(LockScope, scope, Item, locked_row, lambda rows: rows)

    def unwrap(error: BaseException) -> BaseException:
        return error

    cost: dict[str, list[float]] = {config: [] for config in configs}
    for _ in range(rounds):
        for config in configs:
            uninstall = _install(config)
            try:
                started = time.process_time()
                for _ in range(calls):
                    if events.observing():
                        with events.ObservedOperation(attempt, "op", "default", unwrap) as observed:
                            observed.wrap(attempt)("default", 1, (), {})
                    else:
                        attempt("default", 1, (), {})
                cost[config].append((time.process_time() - started) / calls)
            finally:
                uninstall()
    print(f"\nThe observation code alone ({rounds} rounds x {calls} calls, no database): CPU per call")
    for config in configs:
        print(f"{config:<12} {statistics.median(cost[config]) * 1e6:>8.2f} us")


if __name__ == "__main__":
    raise SystemExit(main())
