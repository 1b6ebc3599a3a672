"""``worker_heartbeat()``: renew every claim of one worker from a background thread, one statement per beat.

The worker asks ``beat.holds(claim)`` before starting (or between the steps of) a job: it answers from a fresh beat
only, never from one the worker slept through; ``beat.lost`` lists the jobs it lost. See docs/claims.md.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from django.db import DatabaseError, connections

from lockkit.claims import inputs
from lockkit.claims.beat import BeatThread
from lockkit.claims.renewal import renew_held
from lockkit.claims.value import Claim
from lockkit.validation import duration

logger = logging.getLogger("lockkit.claims")

#: A beat older than this many intervals is not trusted by ``holds()``: the beating thread could not beat (the
#: process was stopped, the database was unreachable or a renewal waited on a lock), so a fresh beat is made first.
STALE_AFTER = 1.5


class worker_heartbeat:  # a context manager named like a function, as Django's atomic
    """Context manager that renews all of a worker's claims every ``every`` seconds from a background thread.

    The thread calls ``heartbeat_worker(model_or_queryset, worker=..., lease=...)`` on entry and then every
    ``every`` seconds, on its own database connection (closed when the thread ends). A beat that fails with a
    database error (a lost connection, a lock timeout) is logged, kept in ``error`` and tried again at the next
    beat on a fresh connection; a later successful beat clears ``error``. Leaving the block raises the error of
    the latest beat if it failed (the leases may have run out), or the error that stopped the thread, unless the
    block itself raised. Losing claims is not an error: ``holds()`` and ``lost`` report it. ``holds()`` never
    answers from a beat older than 1.5 intervals (the worker was paused, or the database unreachable): it beats
    first, and answers ``False`` if it cannot. See
    https://docs.djangoproject.com/en/stable/ref/databases/#connection-management.

    ``with worker_heartbeat(Job.objects.all(), worker=NAME, lease=30, every=10) as beat: ...``

    Args:
        model_or_queryset: The rows whose claims are renewed (a queryset, manager or model class of a
            ``Claimable`` model).
        worker: The worker name the claims are made for.
        lease: The lease each beat sets, in seconds or a ``timedelta`` (on the database clock).
        every: Seconds (or a ``timedelta``) between beats; positive and shorter than ``lease``.
        using: The database alias; default the queryset's bound database, else ``router.db_for_write(model)``.

    Attributes:
        held (dict): ``{pk: claim_token}`` of the claims the latest successful beat renewed.
        lost (set): The primary keys of the claims lost since the block was entered: held at a beat and, at a
            later beat, not held by the worker any more because another claim took the row or the lease expired
            (reclaimed or not). A claim its worker completed or released while its lease ran, or whose row it
            deleted, is not lost; nor is a row the worker holds again under a newer claim.
        last_beat (float | None): ``time.monotonic()`` when the latest successful beat returned; ``None`` before.
        error (BaseException | None): The failure of the latest beat, ``None`` when it succeeded.
        every (float): Seconds between beats.
        lease (float): Seconds each beat sets.

    Raises:
        TypeError, ValueError: a bad argument (``every`` not shorter than ``lease``, a non-positive one, a bad
            worker name or queryset), when constructed, before any SQL runs.
        DatabaseError: on leaving the block, when the latest beat failed (a ``LockError`` subclass when lockkit
            classified it), or the error that stopped the thread.
        RuntimeError: the same object entered twice.
    """

    def __init__(
        self,
        model_or_queryset: Any,
        *,
        worker: str,
        lease: float | timedelta,
        every: float | timedelta,
        using: str | None = None,
    ) -> None:
        """Check the arguments; nothing runs until the block is entered."""
        candidates = inputs.queryset(model_or_queryset, "model_or_queryset")
        self.model = inputs.claimable_model(candidates.model, "model_or_queryset")
        self.worker = inputs.worker(worker)
        self.lease = inputs.lease(lease)
        self.every = duration(every, "every")
        if self.every >= self.lease:
            raise ValueError(f"every must be shorter than the lease ({self.lease:g}s), got {self.every:g}s")
        self.alias = inputs.alias_for(using, candidates)
        self._candidates = candidates.using(self.alias)
        self.held: dict[Any, int] = {}
        self.lost: set[Any] = set()
        self.last_beat: float | None = None
        self.error: BaseException | None = None
        self._clock: datetime | None = None  # the database clock of the latest successful beat
        self._ends: dict[Any, datetime] = {}  # pk -> the lease end the latest beat set
        self._crashed: BaseException | None = None
        self._lock = threading.Lock()
        self._beating = threading.Lock()
        self._beaten = threading.Event()
        self._thread = BeatThread(
            self._scheduled,
            every=self.every,
            alias=self.alias,
            name=f"lockkit-worker-beat-{self.worker}",
            first_at_once=True,
            on_failure=self._failed,
            on_crash=self._crash,
        )

    def holds(self, claim: Claim) -> bool:
        """Whether ``claim`` is still held, as a recent beat says: ask it before starting a job, and between steps.

        ``True`` when the latest beat renewed the claim's row with the claim's token; also for a claim made (or
        renewed by ``heartbeat()``) after the latest beat, which that beat could not see yet (the next one will),
        and before the first beat. ``False`` otherwise: the row was not renewed (lost, completed, released), or
        carries a newer claim.

        A beat is trusted while it is at most ``STALE_AFTER`` (1.5) intervals old. An older one means the thread
        could not beat: the process was stopped (``SIGSTOP``, a VM paused) or the database was unreachable or slow,
        and the claim may have expired and gone to another worker meanwhile. Then ``holds()`` first beats itself
        on the calling thread's connection (waiting for a beat already in flight, within the lock timeout) and
        answers from that beat; if the beat fails with a database error (logged, kept in ``error``, the calling
        thread's connection closed), it answers ``False``: a worker never starts a job it may no longer hold.

        Raises:
            TypeError, ValueError: ``claim`` is not a valid ``Claim``, or not one of this heartbeat's model, alias
                and worker.
        """
        held = inputs.claim(claim)
        pk = inputs.exact_pk(held.model, held.pk, "claim.pk")
        if (held.model, held.alias, held.worker) != (self.model, self.alias, self.worker):
            raise ValueError(
                f"claim is a claim of {held.model.__name__} on {held.alias!r} by {held.worker!r}; this heartbeat "
                f"renews {self.model.__name__} claims on {self.alias!r} by {self.worker!r}"
            )
        if self._stale() and not self._refresh():
            return False
        with self._lock:
            clock, tokens = self._clock, self.held
        if clock is None:
            return True
        token = tokens.get(pk)
        if token is not None:
            return held.token >= token  # a larger token: claimed again by this worker after the beat
        # Made (or renewed) within a beat interval before the beat: the beat may have run before it committed.
        moment = held.lease_expires_at - timedelta(seconds=held.lease)
        return moment >= clock - timedelta(seconds=self.every)

    def _stale(self) -> bool:
        """Whether the latest successful beat is too old to answer from (never before the first one)."""
        last = self.last_beat
        return last is not None and time.monotonic() - last > STALE_AFTER * self.every

    def _refresh(self) -> bool:
        """Beat now on the calling thread, unless a beat in flight (waited for) made the answer fresh; success."""
        with self._beating:
            if not self._stale():  # the thread's beat, in flight when we asked, has just succeeded
                return True
            try:
                held, clock = renew_held(
                    self._candidates, worker=self.worker, lease=self.lease, using=self.alias
                )
            except DatabaseError as failure:
                with self._lock:
                    self.error = failure
                logger.warning(
                    "worker_heartbeat of %r: the beat before answering holds() failed: %s",
                    self.worker,
                    failure,
                )
                connections[self.alias].close()
                return False
            self._record(held, clock)
        return True

    def beat(self) -> dict[Any, int]:
        """Renew now, on the calling thread's connection, and update ``held``/``lost``; return what it renewed.

        For a worker that wants ``holds()`` to know at once (after claiming a batch, before starting it); the
        thread keeps beating on its own schedule.

        Raises:
            LockError: the database failed (``ConnectionLost``, ``LockTimeout``...), as ``heartbeat_worker()``
                reports it.
        """
        with self._beating:  # one beat at a time: the thread's and a caller's
            held, clock = renew_held(self._candidates, worker=self.worker, lease=self.lease, using=self.alias)
            self._record(held, clock)
        return dict(held)

    def __enter__(self) -> worker_heartbeat:
        """Start the beating thread.

        Raises:
            RuntimeError: this object was already entered.
        """
        self._thread.start("worker_heartbeat")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the thread (waiting for a beat in flight), then raise the latest beat's failure, if any."""
        # A beat in flight is bounded by the lock timeout; give it that long and then some.
        stopped = self._thread.stop(timeout=self.lease + 30)
        if not stopped:  # pragma: no cover - a beat stuck past every timeout
            logger.error("worker_heartbeat of %r: the beating thread did not stop in time", self.worker)
        if exc_type is not None:
            return
        failure = self._crashed or self.error
        if failure is not None:
            raise failure

    def wait_for_beat(self, timeout: float) -> bool:
        """Block until a beat has succeeded since the block was entered (for tests and start-up); ``False`` on timeout."""
        return self._beaten.wait(timeout)

    def _record(self, held: dict[Any, int], clock: Any) -> None:
        """Keep a successful beat's result; work out which claims held at the previous beat were lost since."""
        pk_field = self.model._meta.pk
        assert pk_field is not None
        renewed = {pk_field.to_python(pk): token for pk, token in held.items()}
        previous = self.held
        # Not renewed with the same token; a row the worker holds again under a newer claim is not lost.
        gone = {pk: token for pk, token in previous.items() if pk not in renewed}
        lost = self._lost_among(gone, clock) if gone else set()
        ends: dict[Any, datetime] = {}
        if clock is not None:
            end = clock + timedelta(seconds=self.lease)
            ends = dict.fromkeys(renewed, end)
        with self._lock:
            self.held = renewed
            self.lost = self.lost | lost  # a new set: a reader iterating the old one is not disturbed
            self._ends = ends
            if clock is not None:
                self._clock = clock
            self.last_beat = time.monotonic()
            self.error = None
        self._beaten.set()

    def _lost_among(self, gone: dict[Any, int], clock: Any) -> set[Any]:
        """Which claims not renewed by this beat were lost, rather than ended by the worker itself in time.

        Ended in time: the row still carries the claim's token and worker, is not claimed, and the lease the
        previous beat set had not run out by this beat's clock (so no reaper can have handed it back). A deleted
        row counts as ended.
        """
        lost: set[Any] = set()
        rows = {
            row["pk"]: row
            for row in self._candidates.model._base_manager.using(self.alias)
            .filter(pk__in=list(gone))
            .values("pk", "claim_token", "claimed_by", "lease_expires_at")
        }
        for pk, token in gone.items():
            row = rows.get(pk)
            if row is None:
                continue
            newer = row["claim_token"]
            if row["claimed_by"] == self.worker and newer is not None and newer > token:
                continue  # ended and claimed again by this worker between the renewal and this read: not lost
            end = self._ends.get(pk)
            ended_in_time = (
                row["claim_token"] == token
                and row["claimed_by"] == self.worker
                and row["lease_expires_at"] is None
                and end is not None
                and clock is not None
                and end > clock
            )
            if not ended_in_time:
                lost.add(pk)
        return lost

    def _scheduled(self) -> bool:
        """The thread's beat (it beats on entry, then every ``every`` seconds)."""
        self.beat()
        return True

    def _failed(self, failure: DatabaseError) -> None:
        with self._lock:
            self.error = failure
        logger.warning("worker_heartbeat of %r failed, retrying: %s", self.worker, failure)

    def _crash(self, unexpected: BaseException) -> None:
        self._crashed = unexpected
        self.error = unexpected
