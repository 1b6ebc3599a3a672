"""The worker's claims on task rows: claiming ready (and expired) tasks, and one heartbeat for all of them.

Built on lockkit.claims. ``claim_next(..., expired=True)`` and ``heartbeat_worker`` are used when
lockkit.claims provides them; until then the two private fallbacks here do the same with public claims calls
and the ORM (a ``reclaim_expired`` pass when a claim comes back short; an ``UPDATE`` then a ``SELECT`` per beat).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from types import TracebackType
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import QuerySet
from django.tasks.base import TaskResultStatus

from lockkit import claims
from lockkit.backends import claims_sql_for
from lockkit.claims import Claim, Claimed

logger = logging.getLogger("lockkit.tasks.worker")

_TAKES_EXPIRED = "expired" in inspect.signature(claims.claim_next).parameters


def claim_ready(
    candidates: QuerySet[Any],
    *,
    worker: str,
    lease: float,
    limit: int,
    values: dict[str, Any],
    order_by: list[Any],
) -> list[Claimed[Any]]:
    """Claim up to ``limit`` rows of ``candidates``: free ones, and those whose lease expired.

    Raises:
        django.db.DatabaseError: as ``lockkit.claims.claim_next``.
    """
    call: dict[str, Any] = {
        "worker": worker,
        "lease": lease,
        "limit": limit,
        "set": values,
        "order_by": order_by,
        "fetch": True,
    }
    if _TAKES_EXPIRED:
        claim_next: Any = claims.claim_next  # typed by lockkit.claims once it takes expired=
        found: list[Claimed[Any]] = claim_next(candidates, expired=True, **call)
        return found
    found = claims.claim_next(candidates, **call)
    if len(found) < limit:
        # Expired claims are handed back first (their next claim counts the attempt), then claimed.
        running = candidates.model._base_manager.filter(status=TaskResultStatus.RUNNING)
        if claims.reclaim_expired(running.using(candidates.db), set={"status": TaskResultStatus.READY}):
            found += claims.claim_next(candidates, **{**call, "limit": limit - len(found)})
    return found


def _renew(model: Any, alias: str, worker: str, lease: float) -> dict[Any, int]:
    """Renew every live claim of ``worker`` on ``model``'s table; ``{pk: token}`` of the claims still held."""
    heartbeat_worker = getattr(claims, "heartbeat_worker", None)
    if heartbeat_worker is not None:
        held: dict[Any, int] = heartbeat_worker(model, worker=worker, lease=lease, using=alias)
        return held
    statements = claims_sql_for(model, alias)
    mine = model._base_manager.using(alias).filter(claimed_by=worker, lease_expires_at__isnull=False)
    mine.update(lease_expires_at=statements.lease_end(lease))
    return dict(mine.values_list("pk", "claim_token"))


class WorkerBeat:
    """A background thread renewing every claim the worker holds, in one statement per beat.

    ``holds(claim)`` says whether a claim may still be worked on: it was in the last beat's answer, or it was
    made after that beat began. A beat that fails (the database is unreachable) is retried at the next one;
    once no beat has succeeded for a whole lease, ``holds`` answers ``False`` until one does, so a worker
    that was frozen or cut off does not start tasks that other workers may already have taken.
    """

    def __init__(self, model: Any, alias: str, *, worker: str, lease: float, every: float) -> None:
        """Prepare the thread (started on ``__enter__``)."""
        self.model, self.alias, self.worker, self.lease, self.every = model, alias, worker, lease, every
        self._held: dict[Any, int] = {}
        self._beat_started = time.monotonic()
        self._succeeded = time.monotonic()
        self._claimed_at: dict[tuple[Any, int], float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lockkit-tasks-beat-{worker}", daemon=True)

    def claimed(self, claim: Claim) -> None:
        """Record that ``claim`` was just made (it is held until a later beat says otherwise)."""
        with self._lock:
            self._claimed_at[(claim.pk, claim.token)] = time.monotonic()

    def forget(self, claim: Claim) -> None:
        """The claim ended (completed or released): stop tracking it."""
        with self._lock:
            self._claimed_at.pop((claim.pk, claim.token), None)

    def holds(self, claim: Claim) -> bool:
        """Whether the worker still holds ``claim``, as far as the latest beat knows."""
        now = time.monotonic()
        with self._lock:
            made = self._claimed_at.get((claim.pk, claim.token))
            if made is not None and now - made < self.lease and made >= self._beat_started:
                return True  # claimed after the latest beat began: that beat's answer does not cover it
            if now - self._succeeded >= self.lease:
                return False  # no beat succeeded for a whole lease: the claim may have expired
            return self._held.get(claim.pk) == claim.token

    def beat(self) -> None:
        """Renew now (on this thread's connection).

        Raises:
            django.db.DatabaseError: the renewal failed.
        """
        started = time.monotonic()
        held = _renew(self.model, self.alias, self.worker, self.lease)
        with self._lock:
            self._held, self._beat_started, self._succeeded = held, started, started

    def __enter__(self) -> WorkerBeat:
        """Start the thread."""
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the thread, waiting for a beat in flight."""
        self._stop.set()
        self._thread.join(timeout=self.lease)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every):
                try:
                    self.beat()
                except DatabaseError as failure:
                    logger.warning("worker %s: heartbeat failed, retrying: %s", self.worker, failure)
                    connections[self.alias].close()
        finally:
            connections.close_all()
