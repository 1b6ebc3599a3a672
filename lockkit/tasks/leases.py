"""The worker's claims on task rows: claiming ready (and expired) tasks, and one heartbeat for all of them.

Built on lockkit.claims: ``claim_next(..., expired=True)`` takes ready tasks and tasks whose worker's lease ran
out in one statement; ``worker_heartbeat`` renews all the worker's claims in one statement per beat. What this
adds is the check a worker needs before starting a task: a heartbeat answer that is older than one beat (the
process was frozen, or cut off) is not trusted, a fresh beat is made first.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import QuerySet

from lockkit.claims import Claim, Claimed, claim_next, worker_heartbeat

logger = logging.getLogger("lockkit.tasks.worker")


def claim_ready(
    candidates: QuerySet[Any],
    *,
    worker: str,
    lease: float,
    limit: int,
    values: dict[str, Any],
    order_by: list[Any],
) -> list[Claimed[Any]]:
    """Claim up to ``limit`` rows of ``candidates``: free ones, and those whose lease expired (one statement).

    Raises:
        django.db.DatabaseError: as ``lockkit.claims.claim_next``.
    """
    return claim_next(
        candidates,
        worker=worker,
        lease=lease,
        limit=limit,
        set=values,
        order_by=order_by,
        expired=True,
        fetch=True,
    )


class WorkerBeat:
    """``lockkit.claims.worker_heartbeat`` for one worker's task claims, with a freshness check for ``holds``.

    ``holds(claim)`` answers from the latest beat when it is recent (within one and a half beat intervals);
    otherwise (the process was stopped, the database unreachable) it makes a beat on the calling thread first,
    and answers ``False`` if that fails: a worker never starts a task it may no longer hold. Before the first
    beat has returned, ``worker_heartbeat.holds`` answers (a claim just made is held).
    """

    def __init__(self, queryset: QuerySet[Any], *, worker: str, lease: float, every: float) -> None:
        """Prepare the heartbeat (its thread starts on ``__enter__``)."""
        self.alias = str(queryset.db)
        self.every = every
        self._beat = worker_heartbeat(queryset, worker=worker, lease=lease, every=every, using=self.alias)

    @property
    def held(self) -> dict[Any, int]:
        """``{pk: claim_token}`` of the claims the latest successful beat renewed."""
        return self._beat.held

    @property
    def last_beat(self) -> float | None:
        """``time.monotonic()`` when the latest successful beat returned; ``None`` before the first."""
        return self._beat.last_beat

    def holds(self, claim: Claim) -> bool:
        """Whether the worker still holds ``claim``, by a beat at most one and a half intervals old."""
        last = self._beat.last_beat
        # Before the first beat (just started) a fresh claim is held; after, a stale answer is not trusted.
        if last is not None and time.monotonic() - last > 1.5 * self.every:
            try:
                self._beat.beat()
            except DatabaseError as failure:
                logger.warning("heartbeat before starting task %s failed: %s", claim.pk, failure)
                connections[self.alias].close()
                return False
        return self._beat.holds(claim)

    def __enter__(self) -> WorkerBeat:
        """Start beating."""
        self._beat.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        """Stop beating; a failure of the last beat is logged, not raised (the claims ended or will expire)."""
        try:
            self._beat.__exit__(*exc_info)
        except DatabaseError as failure:
            logger.warning("the last heartbeat failed: %s", failure)
