"""The claim protocol, written with plain ``lockkit.locked`` scopes (until ``lockkit.claims`` is available).

Every step is a short transaction of its own: the work happens after the claim has committed, never inside it.
- ``claim``/``claim_next`` lock a pending row (``claim_next`` with ``SKIP LOCKED``, so workers never wait
  on each other), mark it running with the worker, a lease (database time) and the next token, and commit.
- ``complete``/``fail``/``heartbeat`` are single guarded ``UPDATE``s that match only the current claim (state,
  worker and token): a worker whose job was reclaimed and claimed again cannot overwrite the new owner
  (fencing).
- ``reclaim_expired`` returns running jobs whose lease has passed to ``pending`` (or ``failed`` after
  ``max_attempts``).
The jobs services import only the names below, so switching to ``lockkit.claims`` happens in this module
alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import router, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Now

from lockkit import locked
from sample_project.jobs.models import Job, JobRun


@dataclass(frozen=True)
class Claim:
    """A worker's hold on one job: valid while the job is running, claimed by ``worker`` with ``token``."""

    pk: int
    worker: str
    token: int


def claim_of(job_id: int, worker: str, token: int) -> Claim | None:
    """The claim a client reports (over HTTP): job, worker and token; completing it checks it is current.

    (``None`` would mean "not that worker's"; here ``complete`` checks the worker itself.)
    """
    return Claim(job_id, worker, token)


def _lease_end(lease: timedelta) -> ExpressionWrapper[CombinedExpression]:
    # Database time on both sides of every comparison: worker clocks may disagree.
    return ExpressionWrapper(Now() + Value(lease), output_field=DateTimeField())


def _take(alias: str, job: Job, worker: str, lease: timedelta) -> Claim:
    Job.objects.using(alias).filter(pk=job.pk).update(
        state=Job.State.RUNNING,
        claimed_by=worker,
        claim_token=F("claim_token") + 1,
        claimed_at=Now(),
        lease_expires_at=_lease_end(lease),
        attempts=F("attempts") + 1,
    )
    return Claim(job.pk, worker, job.claim_token + 1)  # exact: the row is locked by this transaction


def claim(job_id: int, worker: str, lease: timedelta) -> Claim | None:
    """Claim one given job if it is pending, waiting (up to the lock timeout) for a concurrent claimer.

    Raises:
        Job.DoesNotExist: no such job.
    """
    with locked(model=Job) as scope:
        job = scope.get(Job.objects.only("pk", "state", "claim_token"), pk=job_id)
        if job.state != Job.State.PENDING:
            return None
        return _take(scope.alias, job, worker, lease)


def claim_next(worker: str, lease: timedelta) -> Claim | None:
    """Claim the oldest pending job nobody else is claiming right now, or return ``None``."""
    with locked(model=Job, skip_locked=True) as scope:
        pending = Job.objects.filter(state=Job.State.PENDING).only("pk", "claim_token").order_by("pk")
        job = scope.lock(pending).first()
        if job is None:
            return None
        return _take(scope.alias, job, worker, lease)


def _current(claim: Claim) -> Any:
    return Job.objects.using(router.db_for_write(Job)).filter(
        pk=claim.pk, state=Job.State.RUNNING, claimed_by=claim.worker, claim_token=claim.token
    )


def complete(claim: Claim, result: Any = None) -> bool:
    """Mark the job done and log the run, only if ``claim`` is still current. Returns whether it was."""
    alias = router.db_for_write(Job)
    with transaction.atomic(using=alias):
        updated = _current(claim).update(
            state=Job.State.DONE, result=result, finished_at=Now(), lease_expires_at=None
        )
        if updated:
            JobRun.objects.using(alias).create(job_id=claim.pk, worker=claim.worker, token=claim.token)
    return bool(updated)


def fail(claim: Claim, error: str) -> bool:
    """Mark the job failed, only if ``claim`` is still the current claim. Returns whether it was."""
    updated = _current(claim).update(
        state=Job.State.FAILED, result={"error": error}, finished_at=Now(), lease_expires_at=None
    )
    return bool(updated)


def heartbeat(claim: Claim, lease: timedelta) -> bool:
    """Extend the lease of ``claim`` from now, only if it is still current. Returns whether it was."""
    return bool(_current(claim).update(lease_expires_at=_lease_end(lease)))


def reclaim_expired(max_attempts: int) -> int:
    """Return running jobs whose lease expired to pending (failed after ``max_attempts``); count them."""
    with locked(model=Job, skip_locked=True) as scope:
        expired = Job.objects.filter(state=Job.State.RUNNING, lease_expires_at__lt=Now())
        ids = list(scope.lock(expired).values_list("pk", flat=True))
        if not ids:
            return 0
        jobs = Job.objects.using(scope.alias).filter(pk__in=ids)
        jobs.filter(attempts__gte=max_attempts).update(
            state=Job.State.FAILED, lease_expires_at=None, result={"error": "lease expired"}
        )
        jobs.filter(attempts__lt=max_attempts).update(state=Job.State.PENDING, lease_expires_at=None)
        return len(ids)
