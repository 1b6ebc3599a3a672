"""Paired, alternating rounds: every implementation of a case runs once per round, in a rotating order.

Runs of one round are adjacent in time, so a ratio computed within a round compares runs that met the same machine
load. Warm-up rounds run first and are discarded (on top of each run's own warm-up window).
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks import pgbench, schema, workers
from benchmarks.dbserver import Target
from benchmarks.plan import Impl, Settings, Workload
from benchmarks.results import Run


def run_workload(
    workload: Workload, target: Target, settings: Settings, log: Callable[[str], None]
) -> list[Run]:
    """Every measured run of ``workload`` (warm-up rounds excluded)."""
    runs: list[Run] = []
    procs_list = workload.quick_procs if settings.quick else workload.procs
    # Enough jobs that no implementation drains the queue while it runs (pgbench runs whole seconds).
    jobs = 50_000 * pgbench.run_seconds(settings.warmup, settings.duration)
    for procs in procs_list:
        for number in range(-settings.warmup_rounds + 1, settings.rounds + 1):
            shift = (number - 1) % len(workload.impls)
            order = workload.impls[shift:] + workload.impls[:shift]
            for impl in order:
                if workload.claims:
                    schema.reset_jobs(jobs)
                run = _run_one(workload, impl, target, procs, number, settings)
                if workload.claims:
                    run.exhausted = run.exhausted or schema.pending_jobs() == 0
                tag = "warm-up" if number < 1 else f"round {number}"
                log(
                    f"  {workload.key:<11} {impl.key:<10} procs={procs} {tag:<8} {run.rate:10.1f} {workload.unit}/s"
                    f"  p50={run.p50_ms:.2f}ms p99={run.p99_ms:.2f}ms waiting={run.lock_waiting:.2f}"
                    + (f" errors={run.errors}" if run.errors else "")
                    + (f" retries={run.retries} deadlocks={run.deadlocks}" if run.retries else "")
                    + (" EXHAUSTED" if run.exhausted else "")
                )
                if number >= 1:
                    runs.append(run)
    return runs


def _run_one(
    workload: Workload, impl: Impl, target: Target, procs: int, number: int, settings: Settings
) -> Run:
    if impl.op is not None:
        return workers.run(workload.key, impl.key, impl.op, procs, number, settings.warmup, settings.duration)
    assert impl.script is not None
    return pgbench.run(
        target, workload.key, impl.key, impl.script, procs, number, settings.warmup, settings.duration
    )
