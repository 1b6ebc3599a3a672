"""The code that runs in each demo worker process (started with ``spawn``: its connections are its own).

Every entry point first calls ``bootstrap`` (so Django is configured in the child), opens its connection,
meets the other workers at a barrier, works, and sends its ``WorkerStats`` to the parent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sample_project.demo.bootstrap import bootstrap
from sample_project.demo.stats import WorkerStats

BARRIER_TIMEOUT = 120.0
TICK = 20


@dataclass
class Channels:
    """What a worker shares with the parent: a progress counter, a results queue, a start barrier, and the
    event a designated victim sets once it holds a claim (so the parent can kill it mid-job)."""

    counter: Any
    results: Any
    barrier: Any
    victim_ready: Any

    def tick(self, n: int) -> None:
        with self.counter.get_lock():
            self.counter.value += n


def sale_implementations() -> dict[str, Callable[[str, int], int]]:
    """The function each flash-sale implementation calls per order (the demo's tables point at them)."""
    from sample_project.inventory.guarded import reserve_stock_guarded
    from sample_project.inventory.handwritten import reserve_stock_by_hand
    from sample_project.inventory.naive import reserve_stock_naive
    from sample_project.inventory.services import reserve_stock

    return {
        "naive": reserve_stock_naive,
        "hand": reserve_stock_by_hand,
        "lockkit": reserve_stock,
        "guarded": reserve_stock_guarded,
    }


def queue_implementations() -> dict[str, tuple[Callable[..., Any], ...]]:
    """The functions each job-queue implementation calls: claim the next job, complete it."""
    from sample_project.jobs.naive import naive_claim_next, naive_complete
    from sample_project.jobs.services import claim_next_job, complete_job

    return {"naive": (naive_claim_next, naive_complete), "lockkit": (claim_next_job, complete_job)}


def sale_worker(
    channels: Channels, url: str, implementation: str, orders: list[tuple[str, int]], lock_timeout: float
) -> None:
    """Place ``orders`` one by one with ``implementation``; count successes, refusals, retries, timeouts."""
    bootstrap(url)
    from django.db import connections
    from django.test.utils import override_settings

    from lockkit import LockTimeout, RetryEvent, RetryPolicy
    from sample_project.inventory.errors import InsufficientStock

    stats = WorkerStats()

    def count_retry(event: RetryEvent) -> None:
        stats.retries += 1

    reserve = sale_implementations()[implementation]
    policy = RetryPolicy(attempts=5, before_retry=count_retry)
    with override_settings(LOCKKIT={"LOCK_TIMEOUT": lock_timeout, "RETRY": policy}):
        connections["default"].ensure_connection()
        channels.barrier.wait(BARRIER_TIMEOUT)
        stats.started = time.monotonic()
        for sku, quantity in orders:
            began = time.perf_counter()
            try:
                reserve(sku, quantity)
                stats.confirm(sku, quantity)
            except InsufficientStock:
                stats.refusals += 1
            except LockTimeout:
                stats.lock_timeouts += 1
            except Exception as exc:  # counted and reported, not hidden: the table shows errors
                stats.errors += 1
                stats.first_error = stats.first_error or f"{type(exc).__name__}: {exc}"
            stats.latencies.append(time.perf_counter() - began)
            stats.operations += 1
            if stats.operations % TICK == 0:
                channels.tick(TICK)
        channels.tick(stats.operations % TICK)
        stats.finished = time.monotonic()
    channels.results.put(stats)
    connections.close_all()


def job_worker(
    channels: Channels,
    url: str,
    implementation: str,
    worker_id: str,
    lease: float,
    work: float,
    victim_after: int | None,
    stall_after: int | None = None,
) -> None:
    """Claim jobs until none is left; a victim stops mid-job after ``victim_after`` claims.

    A ``stall_after`` worker (lockkit only) stalls mid-job after that many claims, past its lease, until its job
    has been reclaimed and done by another worker (a forced lease expiry), then tries to complete it: the fenced
    completion refuses, and the job's effect is not applied a second time.

    ``lockkit`` workers run until no job is pending or running (an abandoned one is reclaimed after its lease);
    ``naive`` workers until none is pending (they cannot tell an abandoned job from a running one).
    """
    bootstrap(url)
    from django.db import connections

    from sample_project.jobs.models import Job
    from sample_project.jobs.services import reclaim_expired_jobs

    # The functions the queue table's legend names (queue_implementations), called here.
    claim_next, complete = queue_implementations()[implementation]

    stats = WorkerStats()
    connections["default"].ensure_connection()
    channels.barrier.wait(BARRIER_TIMEOUT)
    stats.started = time.monotonic()
    unfinished = Job.objects.filter(state__in=[Job.State.PENDING, Job.State.RUNNING])
    naive = implementation == "naive"
    while True:
        began = time.perf_counter()
        claim = claim_next(worker_id) if naive else claim_next(worker_id, lease=lease)
        if claim is None:
            if naive or not unfinished.exists():
                break
            # Nothing pending, but a job is still running somewhere: perhaps abandoned. Reclaim what expired.
            stats.reclaimed += reclaim_expired_jobs()
            time.sleep(0.05)
            continue
        stats.latencies.append(time.perf_counter() - began)
        stats.operations += 1
        if victim_after is not None and stats.operations == victim_after:
            channels.victim_ready.set()
            time.sleep(3600)  # "working" when the parent SIGKILLs this process
        if stall_after is not None and not naive and stats.operations == stall_after:
            _stall_until_redone(claim)
        time.sleep(work)  # the job itself: I/O-bound work, done after the claim committed
        if isinstance(claim, int):
            complete(claim, worker_id)
            stats.successes += 1
            channels.tick(1)
        elif complete(claim, result={"worker": worker_id}):
            stats.successes += 1
            channels.tick(1)
        else:
            stats.stale += 1
    stats.finished = time.monotonic()
    channels.results.put(stats)
    connections.close_all()


def _stall_until_redone(claim: Any, timeout: float = 120.0) -> None:
    """Wait, holding a claim whose lease runs out, until another worker has reclaimed and done its job."""
    from sample_project.jobs.models import Job

    redone = Job.objects.filter(pk=claim.pk, state=Job.State.DONE).exclude(claim_token=claim.token)
    deadline = time.monotonic() + timeout
    while not redone.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
