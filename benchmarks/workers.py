"""Running a Django operation in N processes at once: forked after setup, started together, timed over a window.

Each process opens its own connection before the start (connection set-up is not measured), runs its operation in
a loop through warm-up and window, and reports what completed inside the window.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, connections

from benchmarks import ops
from benchmarks.results import Run, percentile
from lockkit.testing import LockWaitMonitor

_MAX_ERRORS = 10_000


@dataclass
class _Report:
    units: int = 0
    ops: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)


def _child(
    name: str, worker: int, seed: int, barrier: Any, queue: Any, start: Any, warmup: float, duration: float
) -> None:
    report = _Report()
    try:
        op = ops.build(name, random.Random(seed * 1000 + worker), worker)
        connection.ensure_connection()
        ops.counters.clear()
        barrier.wait(60)
        begin = start.value + warmup
        end = begin + duration
        errors = 0
        before_window: dict[str, int] | None = None
        while True:
            t0 = time.perf_counter()
            try:
                units = op()
            except Exception as exc:  # a failed operation is a figure of the run, not a crash
                errors += 1
                if time.time() >= begin:
                    report.errors[type(exc).__name__] = report.errors.get(type(exc).__name__, 0) + 1
                if errors > _MAX_ERRORS or time.time() >= end:  # a failing operation never outlives its run
                    break
                continue
            elapsed = time.perf_counter() - t0
            now = time.time()
            if now >= end:
                break
            if now >= begin:
                if before_window is None:
                    before_window = dict(ops.counters)  # retries of the warm-up are not the window's
                report.units += units
                report.ops += 1
                report.latencies.append(elapsed * 1000)
        report.counters = {k: v - (before_window or {}).get(k, 0) for k, v in ops.counters.items()}
    finally:
        queue.put(report)
        connections.close_all()


def run(
    workload: str, impl: str, op_name: str, procs: int, round_: int, warmup: float, duration: float
) -> Run:
    """Run ``op_name`` in ``procs`` processes for ``warmup + duration`` seconds; return the window's figures."""
    context = multiprocessing.get_context("fork")
    connections.close_all()  # never share a connection with a forked child
    barrier = context.Barrier(procs + 1)
    start = context.Value("d", 0.0)
    queue = context.Queue()
    children = [
        context.Process(
            target=_child,
            args=(op_name, i, round_, barrier, queue, start, warmup, duration),
            name=f"lkbench-{op_name}-{i}",
        )
        for i in range(procs)
    ]
    for child in children:
        child.start()
    with LockWaitMonitor() as sampler:
        start.value = time.time() + 0.05
        barrier.wait(60)
        reports: list[_Report] = [queue.get(timeout=warmup + duration + 120) for _ in children]
    for child in children:
        child.join(30)
    begin = start.value + warmup
    latencies = [ms for report in reports for ms in report.latencies]
    errors: dict[str, int] = {}
    for report in reports:
        for key, count in report.errors.items():
            errors[key] = errors.get(key, 0) + count
    return Run(
        workload=workload,
        impl=impl,
        procs=procs,
        round=round_,
        units=sum(r.units for r in reports),
        ops=sum(r.ops for r in reports),
        seconds=duration,
        p50_ms=percentile(latencies, 0.50),
        p99_ms=percentile(latencies, 0.99),
        lock_waiting=sampler.mean_waiting(begin, begin + duration),
        errors=errors,
        retries=sum(r.counters.get("retries", 0) for r in reports),
        deadlocks=sum(r.counters.get("deadlocks", 0) for r in reports),
        exhausted=any(r.counters.get("empty", 0) for r in reports),
    )
