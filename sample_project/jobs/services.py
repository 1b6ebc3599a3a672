"""Job queue services: enqueue, claim one job or the next, complete with fencing, reclaim abandoned claims.

The claim protocol lives in ``sample_project.jobs.claiming``; this module checks arguments (before any SQL)
and applies the defaults.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sample_project.jobs import claiming
from sample_project.jobs.claiming import Claim
from sample_project.jobs.models import Job
from sample_project.jobs.validation import (
    check_job_id,
    check_lease,
    check_name,
    check_payload,
    check_token,
    check_worker,
)

DEFAULT_LEASE = timedelta(seconds=30)
MAX_ATTEMPTS = 3


def _check_claim(claim: object) -> Claim:
    if not isinstance(claim, Claim):
        raise TypeError(f"claim must be a Claim, not {type(claim).__name__}")
    return claim


def enqueue(name: str, payload: dict[str, Any] | None = None) -> Job:
    """Create a pending job."""
    return Job.objects.create(name=check_name(name), payload=check_payload(payload) or {})


def claim_job(job_id: int, worker_id: str, *, lease: float | timedelta = DEFAULT_LEASE) -> bool:
    """Claim one specific job for ``worker_id``; of several concurrent callers exactly one gets ``True``.

    A caller that finds the row being claimed waits for that transaction (up to the lock timeout), then sees
    the job running and gets ``False``.

    Args:
        job_id: The job's primary key.
        worker_id: Who claims it (stored in ``claimed_by``).
        lease: Seconds or a ``timedelta`` after which an unfinished claim may be reclaimed.

    Returns:
        ``True`` when this call claimed the job, ``False`` when it was not pending.

    Raises:
        TypeError, ValueError: bad arguments, before any SQL.
        Job.DoesNotExist: no such job.
        lockkit.LockTimeout: the row stayed locked longer than the lock timeout.
    """
    return claim_job_for(job_id, worker_id, lease=lease) is not None


def claim_job_for(job_id: int, worker_id: str, *, lease: float | timedelta = DEFAULT_LEASE) -> Claim | None:
    """Like ``claim_job``, returning the ``Claim`` (with its token) or ``None``."""
    return claiming.claim(check_job_id(job_id), check_worker(worker_id), check_lease(lease))


def claim_next_job(worker_id: str, *, lease: float | timedelta = DEFAULT_LEASE) -> Claim | None:
    """Claim the oldest pending job no other worker is claiming (``SKIP LOCKED``), or return ``None``."""
    return claiming.claim_next(check_worker(worker_id), check_lease(lease))


def claim_reported(job_id: int, worker_id: str, token: int) -> Claim | None:
    """Rebuild a claim a client holds (e.g. from a request) to complete it; ``None`` or a stale claim (refused
    by ``complete_job``) when it is not current."""
    return claiming.claim_of(check_job_id(job_id), check_worker(worker_id), check_token(token))


def complete_job(claim: Claim, result: Any = None) -> bool:
    """Finish a claimed job; ``False`` when the claim is stale (reclaimed, maybe claimed by another)."""
    return claiming.complete(_check_claim(claim), result)


def fail_job(claim: Claim, error: str) -> bool:
    """Mark a claimed job failed; ``False`` when the claim is stale."""
    return claiming.fail(_check_claim(claim), str(error))


def heartbeat_job(claim: Claim, *, lease: float | timedelta = DEFAULT_LEASE) -> bool:
    """Extend a claim's lease; ``False`` when the claim is stale."""
    return claiming.heartbeat(_check_claim(claim), check_lease(lease))


def reclaim_expired_jobs(*, max_attempts: int = MAX_ATTEMPTS) -> int:
    """Return abandoned jobs (lease expired) to pending, failed after ``max_attempts``; count them."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"max_attempts must be a positive int, got {max_attempts!r}")
    return claiming.reclaim_expired(max_attempts)
