"""The job queue: W processes claim J jobs with SKIP LOCKED; one is SIGKILLed holding a claim, one stalls.

The killed worker's job stays ``running`` until the lease expires; an idle worker reclaims it and another one
finishes it. The stalled worker's lease runs out mid-job, its job is reclaimed and done by another worker, and its
late completion (effect and completion in one ``fenced()`` transaction) is refused. The audit reads the run log
(each job's effect): a job logged twice had its effect applied twice, a job not ``done`` (or never logged) was lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db.models import Count

from sample_project.demo.processes import run_workers
from sample_project.demo.stats import Totals
from sample_project.demo.workers import job_worker
from sample_project.jobs.models import Job, JobRun


@dataclass(frozen=True)
class QueueAudit:
    jobs: int
    done: int
    run_twice: int
    lost: int


IMPLEMENTATIONS = ("naive", "lockkit")
LABELS = {"naive": "naive read-then-mark", "lockkit": "lockkit SKIP LOCKED claims"}


@dataclass(frozen=True)
class QueueResult:
    implementation: str
    totals: Totals
    audit: QueueAudit
    workers: int
    killed: bool
    lease: float


def reset_jobs(count: int) -> None:
    Job.objects.all().delete()
    Job.objects.bulk_create([Job(name="send-receipt", payload={"order": i}) for i in range(count)])


def audit_jobs() -> QueueAudit:
    runs = dict(JobRun.objects.values("job_id").annotate(n=Count("id")).values_list("job_id", "n"))
    states = dict(Job.objects.values_list("id", "state"))
    return QueueAudit(
        jobs=len(states),
        done=sum(state == Job.State.DONE for state in states.values()),
        run_twice=sum(n > 1 for n in runs.values()),
        lost=sum(state != Job.State.DONE or job_id not in runs for job_id, state in states.items()),
    )


def run_queue(
    url: str,
    implementation: str,
    jobs: int,
    *,
    workers: int,
    progress: Callable[[int], None],
    lease: float = 1.5,
    work: float = 0.002,
    timeout: float = 600.0,
) -> QueueResult:
    """Create ``jobs`` jobs, run ``workers`` claiming processes (worker 0 is killed mid-job), audit."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, not {implementation!r}")
    reset_jobs(jobs)
    # Worker 0 is SIGKILLed holding its first claim; worker 1 (with 3 workers or more) stalls past the lease of its
    # second claim until another worker has redone that job, then tries to complete it (a forced lease expiry).
    per_worker = [
        (
            url,
            implementation,
            f"worker-{i}",
            lease,
            work,
            1 if i == 0 else None,
            2 if i == 1 and workers >= 3 else None,
        )
        for i in range(workers)
    ]
    stats, killed = run_workers(job_worker, per_worker, progress=progress, timeout=timeout, victim=0)
    return QueueResult(implementation, Totals.of(stats), audit_jobs(), workers, killed, lease)
