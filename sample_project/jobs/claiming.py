"""The claim protocol of the jobs app, on ``lockkit.claims``.

Every step is a short transaction of its own: the work happens after the claim has committed, never inside it.
- ``claim``/``claim_next`` claim a pending job (``claim_next`` with ``SKIP LOCKED``, so workers never wait on
  each other), writing the worker, a lease on the database clock and the next token, and mark it running.
- ``complete``/``fail``/``heartbeat`` write only while the claim's token is still the row's (fencing): a worker
  whose job was reclaimed, and perhaps claimed again, writes nothing.
- ``reclaim_expired`` returns running jobs whose lease has passed to ``pending`` (``failed`` after
  ``max_attempts``).
The jobs services import only the names below.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.db.models.functions import Now

from lockkit import locked_operation
from lockkit.claims import Claim, StaleClaim, fenced
from lockkit.claims import claim as claim_row
from lockkit.claims import claim_next as claim_rows
from lockkit.claims import complete as complete_claim
from lockkit.claims import heartbeat as renew
from lockkit.claims import reclaim_expired as reclaim
from sample_project.jobs.models import Job, JobRun

__all__ = ["Claim", "claim", "claim_next", "claim_of", "complete", "fail", "heartbeat", "reclaim_expired"]

_RUNNING = {"state": Job.State.RUNNING}


def claim(job_id: int, worker: str, lease: timedelta) -> Claim | None:
    """Claim one given job if it is pending, waiting (up to the lock timeout) for a concurrent claimer.

    Raises:
        Job.DoesNotExist: no such job.
    """
    found = claim_row(
        Job.objects.filter(pk=job_id),
        worker=worker,
        lease=lease,
        when=Q(state=Job.State.PENDING),
        set=_RUNNING,
    )
    if found is None and not Job.objects.filter(pk=job_id).exists():
        raise Job.DoesNotExist(f"no Job {job_id}")
    return found


def claim_next(worker: str, lease: timedelta) -> Claim | None:
    """Claim the oldest pending job nobody else is claiming right now, or return ``None``."""
    found = claim_rows(Job.objects.filter(state=Job.State.PENDING), worker=worker, lease=lease, set=_RUNNING)
    return found[0] if found else None


def claim_of(job_id: int, worker: str, token: int) -> Claim | None:
    """The claim a client reports (over HTTP), or ``None`` when the job is not claimed by ``worker``.

    ``complete`` fences on the token; the worker name is checked here, so one worker cannot complete
    another's claim by presenting its token.
    """
    job = (
        Job.objects.filter(pk=job_id, claimed_by=worker)
        .values("claimed_at", "lease_expires_at", "attempts")
        .first()
    )
    if job is None or job["lease_expires_at"] is None or job["claimed_at"] is None:
        return None
    lease = (job["lease_expires_at"] - job["claimed_at"]).total_seconds()  # as claimed (or since renewed)
    return Claim(Job, job_id, token, worker, job["lease_expires_at"], job["attempts"], Job.objects.db, lease)


def complete(claim: Claim, result: Any = None) -> bool:
    """Log the run (the job's database effect) and mark the job done, only if ``claim`` is still current.

    ``fenced(claim)`` locks the job row and checks the claim (token, worker, lease by the database clock) first;
    the effect and the completion then commit together. A worker whose lease ran out mid-job (and whose job was
    reclaimed and done by another) writes nothing: each job's effect is applied exactly once. The whole runs in a
    locked operation: retried when the connection was lost before COMMIT, resolved (or ``CommitOutcomeUnknown``)
    when it was lost at COMMIT; a completion repeated after an earlier one committed counts as done. Returns
    whether the claim was current.
    """
    try:
        _complete_and_log(claim, result)
    except StaleClaim as stale:
        return stale.already_done
    return True


@locked_operation(using=lambda claim, result: claim.alias)
def _complete_and_log(claim: Claim, result: Any) -> None:
    with fenced(claim) as scope:
        JobRun.objects.using(scope.alias).create(job_id=claim.pk, worker=claim.worker, token=claim.token)
        complete_claim(claim, set={"state": Job.State.DONE, "result": result, "finished_at": Now()})


def fail(claim: Claim, error: str) -> bool:
    """Mark the job failed, only if ``claim`` is still current. Returns whether it was."""
    try:
        complete_claim(
            claim, set={"state": Job.State.FAILED, "result": {"error": error}, "finished_at": Now()}
        )
    except StaleClaim:
        return False
    return True


def heartbeat(claim: Claim, lease: timedelta) -> bool:
    """Extend the lease of ``claim`` from now, only if it is still current. Returns whether it was."""
    try:
        renew(claim, lease=lease)
    except StaleClaim:
        return False
    return True


def reclaim_expired(max_attempts: int) -> int:
    """Return running jobs whose lease expired to pending (failed after ``max_attempts``); count them."""
    return reclaim(
        Job.objects.filter(state=Job.State.RUNNING),
        set={"state": Job.State.PENDING},
        max_attempts=max_attempts,
        exhausted_set={"state": Job.State.FAILED, "result": {"error": "lease expired"}},
    )
