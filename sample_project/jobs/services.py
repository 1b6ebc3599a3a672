"""Job queue services: enqueue, claim one job or the next, complete with fencing, reclaim abandoned claims.

The claim protocol lives in ``sample_project.jobs.claiming``; this module checks arguments (before any SQL)
and applies the defaults.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from sample_project.jobs import claiming
from sample_project.jobs.claiming import Claim
from sample_project.jobs.models import Job

DEFAULT_LEASE = timedelta(seconds=30)
MAX_ATTEMPTS = 3


def _check_worker(worker_id: object) -> str:
    if not isinstance(worker_id, str):
        raise TypeError(f"worker_id must be a str, not {type(worker_id).__name__}")
    if not worker_id:
        raise ValueError("worker_id must not be empty")
    return worker_id


def _check_job_id(job_id: object) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise TypeError(f"job_id must be an int, not {type(job_id).__name__}")
    if job_id < 1:
        raise ValueError(f"job_id must be a positive int, got {job_id}")
    return job_id


def _check_lease(lease: object) -> timedelta:
    if isinstance(lease, timedelta):
        value = lease.total_seconds()
    elif isinstance(lease, int | float) and not isinstance(lease, bool):
        value = float(lease)
    else:
        raise TypeError(f"lease must be seconds (int/float) or a timedelta, not {type(lease).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"lease must be a positive, finite duration, got {lease!r}")
    return timedelta(seconds=value)


def _check_claim(claim: object) -> Claim:
    if not isinstance(claim, Claim):
        raise TypeError(f"claim must be a Claim, not {type(claim).__name__}")
    return claim


def enqueue(name: str, payload: dict[str, Any] | None = None) -> Job:
    """Create a pending job."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("name must not be empty")
    if payload is not None and not isinstance(payload, dict):
        raise TypeError(f"payload must be a dict or None, not {type(payload).__name__}")
    return Job.objects.create(name=name, payload=payload or {})


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
    return claiming.claim(_check_job_id(job_id), _check_worker(worker_id), _check_lease(lease)) is not None


def claim_job_for(job_id: int, worker_id: str, *, lease: float | timedelta = DEFAULT_LEASE) -> Claim | None:
    """Like ``claim_job``, returning the ``Claim`` (with its token) or ``None``."""
    return claiming.claim(_check_job_id(job_id), _check_worker(worker_id), _check_lease(lease))


def claim_next_job(worker_id: str, *, lease: float | timedelta = DEFAULT_LEASE) -> Claim | None:
    """Claim the oldest pending job no other worker is claiming (``SKIP LOCKED``), or return ``None``."""
    return claiming.claim_next(_check_worker(worker_id), _check_lease(lease))


def claim_reported(job_id: int, worker_id: str, token: int) -> Claim | None:
    """Rebuild a claim a client holds (e.g. from a request) to complete it; ``None`` or a stale claim (refused
    by ``complete_job``) when it is not current."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be an int, not {type(token).__name__}")
    return claiming.claim_of(_check_job_id(job_id), _check_worker(worker_id), token)


def complete_job(claim: Claim, result: Any = None) -> bool:
    """Finish a claimed job; ``False`` when the claim is stale (reclaimed, maybe claimed by another)."""
    return claiming.complete(_check_claim(claim), result)


def fail_job(claim: Claim, error: str) -> bool:
    """Mark a claimed job failed; ``False`` when the claim is stale."""
    return claiming.fail(_check_claim(claim), str(error))


def heartbeat_job(claim: Claim, *, lease: float | timedelta = DEFAULT_LEASE) -> bool:
    """Extend a claim's lease; ``False`` when the claim is stale."""
    return claiming.heartbeat(_check_claim(claim), _check_lease(lease))


def reclaim_expired_jobs(*, max_attempts: int = MAX_ATTEMPTS) -> int:
    """Return abandoned jobs (lease expired) to pending, failed after ``max_attempts``; count them."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"max_attempts must be a positive int, got {max_attempts!r}")
    return claiming.reclaim_expired(max_attempts)
