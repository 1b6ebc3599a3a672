"""Heartbeats: renewing leases while the jobs run, for one claim or for every claim of a worker.

``heartbeat(claim)`` renews one claim now, ``heartbeat_held()`` every claim a worker holds in one statement, and
``heartbeat_every()`` does either from a background thread while a block runs. See docs/claims.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import QuerySet

from lockkit.aio import awaitable
from lockkit.claims import inputs, runner
from lockkit.claims.fencing import fenced_update
from lockkit.claims.sql import claims_sql_for
from lockkit.claims.value import Claim
from lockkit.errors import CommitOutcomeUnknown, ConnectionLost, StaleClaim
from lockkit.scopes.options import FROM_SETTINGS
from lockkit.validation import Duration, duration

logger = logging.getLogger("lockkit.claims")

#: The default interval of ``heartbeat_every``, as a fraction of the lease: two renewals may fail before it runs out.
DEFAULT_FRACTION = 1 / 3

#: A beat older than this many intervals is not trusted by ``heartbeat_every.holds()``: the thread could not beat
#: (the process was stopped, the database was unreachable or a renewal waited on a lock), so it beats first.
STALE_AFTER = 1.5

#: How many primary keys ``lost`` keeps, the latest: a block that lasts a worker's life does not grow with every
#: claim it loses.
LOST_KEPT = 1000


def heartbeat(
    claim: Claim,
    *,
    lease: Duration | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> Claim:
    """Renew a claim's lease from now, on the database clock, if the claim still holds its row.

    Call it periodically while working, well within the lease, so ``reclaim_expired`` leaves the job alone (or let
    ``heartbeat_every(claim)`` call it from a thread). A claim whose lease has lapsed but that no
    ``reclaim_expired`` has handed back is still live and is renewed: its token proves no one else was given the
    job.

    Safe to repeat: renewing a live claim twice only moves its lease again. So a heartbeat whose connection was
    lost, even at COMMIT with the outcome unknown, is sent again on a fresh connection: a worker keeps its job
    through a server restart or a pooler dropping its idle connection.

    Args:
        claim: The claim to renew.
        lease: The new lease in seconds (``int``/``float``) or a ``timedelta``; default the claim's ``lease``.
        lock_timeout: Seconds the row lock may be waited for; default ``settings.LOCKKIT["LOCK_TIMEOUT"]``.

    Returns:
        A new ``Claim`` with the new ``lease_expires_at`` (and ``lease``).

    Raises:
        TypeError, ValueError: ``claim`` is not a ``Claim`` or one of its values is invalid (each message names
            ``claim.<field>``; a pk its column would not store unchanged included), or ``lease`` is not a
            positive duration.
        StaleClaim: the row no longer carries this claim's token and worker (nothing was written).
        LockTimeout: another session held the row longer than the lock timeout (nothing was written).
        ConnectionLost: the database stayed unreachable for the retry policy's ``reconnect_within``.
    """
    held = inputs.claim(claim)
    seconds = held.lease if lease is None else inputs.lease(lease)
    values = {"lease_expires_at": claims_sql_for(held.model, held.alias).lease_end(seconds)}
    try:
        written = fenced_update((held,), values, lock_timeout, doing="renewing the lease of")
    except CommitOutcomeUnknown:
        # Idempotent: renew again, on a new connection.
        written = fenced_update((held,), values, lock_timeout, doing="renewing the lease of")
    return replace(held, lease_expires_at=next(iter(written.values())), lease=seconds)


aheartbeat = awaitable(heartbeat)


def heartbeat_held(
    model_or_queryset: Any,
    *,
    worker: str,
    lease: Duration,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> dict[Any, int]:
    """Renew, in one statement, the lease of every unexpired claim ``worker`` holds on rows of the queryset.

    One renewal for a worker holding many claims (a batch claimed at once, jobs waiting their turn), instead of one
    ``heartbeat()`` per claim. Every row still claimed by ``worker`` (``claimed_by``, compared exactly) whose lease
    has not expired by the database clock gets ``lease_expires_at = <clock> + lease``; its token is unchanged, so
    the worker's ``Claim`` objects stay valid. A claim whose row is not in the result is lost: its lease expired (it
    may be reclaimed, or already claimed again by another worker or by ``claim_next(expired=True)``), it was
    completed or released, or its row was deleted. An expired claim is never renewed here (``heartbeat()`` of that
    one claim still renews it while nobody has taken the row). On PostgreSQL one ``UPDATE`` (one round trip, as one
    message with its opening and ``COMMIT``); on MariaDB/MySQL and SQLite one short transaction that locks the
    claims in primary-key order and renews them. Rows being written by another session (a ``complete()`` in
    flight, a ``fenced()`` block) are waited for, within the lock timeout, never skipped: a claim is never
    reported lost because its worker was finishing it. See
    https://www.postgresql.org/docs/current/sql-update.html.

    Safe to repeat: a renewal whose reply was lost is sent again on a fresh connection (it only moves the
    leases again).

    Args:
        model_or_queryset: The rows to look at (a queryset, manager or model class of a ``Claimable`` model),
            e.g. ``Job.objects.filter(queue="emails")``.
        worker: The worker name the claims were made for.
        lease: The new lease in seconds (``int``/``float``) or a ``timedelta``, counted on the database clock.
        using: The database alias; default the queryset's bound database, else ``router.db_for_write(model)``.
        lock_timeout: Seconds (or a ``timedelta``) a row lock may be waited for; default
            ``settings.LOCKKIT["LOCK_TIMEOUT"]``; ``None`` leaves the connection's own setting.

    Returns:
        ``{pk: claim_token}`` of the claims renewed, i.e. still held by ``worker``.

    Raises:
        TypeError, ValueError: a wrong type, an empty or unstorable worker name, a non-positive lease, a sliced,
            distinct or ``select_for_update()`` queryset; before any SQL runs.
        AliasMismatch: ``using`` differs from the database the queryset is bound to.
        django.db.NotSupportedError: the database is not PostgreSQL, MariaDB 10.6+/MySQL 8 or SQLite 3.35+.
        LockTimeout: a claimed row stayed locked by another session past the lock timeout (nothing renewed).
        ConnectionLost: the database stayed unreachable for the retry policy's ``reconnect_within``.
    """
    renewed, _clock = _renew_held(
        model_or_queryset, worker=worker, lease=lease, using=using, lock_timeout=lock_timeout
    )
    return renewed


aheartbeat_held = awaitable(heartbeat_held)


def _renew_held(
    model_or_queryset: Any,
    *,
    worker: str,
    lease: Duration,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> tuple[dict[Any, int], Any]:
    """``heartbeat_held()``, also returning the database clock the renewal ran at (``None``: no row can match)."""
    candidates = inputs.queryset(model_or_queryset, "model_or_queryset")
    model = inputs.claimable_model(candidates.model, "model_or_queryset")
    name = inputs.worker(worker)
    seconds = inputs.lease(lease)
    alias = inputs.alias_for(using, candidates)
    statements = claims_sql_for(model, alias)
    held: QuerySet[Any] = candidates.using(alias).filter(
        claimed_by=name, lease_expires_at__gt=statements.now()
    )
    values = {"lease_expires_at": statements.lease_end(seconds)}
    doing = f"renewing the worker's leases on its {runner.rows_of(model)}"

    def work() -> tuple[list[Any], Any]:
        return statements.renew_worker(held, name, values)

    def resolve(message: Any, lost: ConnectionLost) -> tuple[list[Any], Any]:
        # Renewing again is harmless: once the lost session has ended, the same statement says what is held.
        runner.await_session_end(alias, message, lost)
        return runner.in_one_message(alias, lock_timeout, work, doing=doing)

    rows, clock = runner.in_one_message(alias, lock_timeout, work, resolve, doing=doing)
    return {row["pk"]: int(row["claim_token"]) for row in rows}, clock


class _BeatThread:
    """A daemon thread calling ``beat()`` every ``every`` seconds until ``stop()`` or until ``beat()`` returns False.

    A ``DatabaseError`` from a beat is passed to ``on_failure`` and the thread's connection to ``alias`` is closed,
    so the next beat runs on a fresh one (a dropped connection, a lock timeout: the leases still have time). Any
    other exception is passed to ``on_crash`` and ends the thread (the owner must learn that nobody renews its
    leases any more). The thread closes its connections when it ends. See
    https://docs.djangoproject.com/en/stable/ref/databases/#connection-management.
    """

    def __init__(
        self,
        beat: Callable[[], bool],
        *,
        every: float,
        alias: str,
        name: str,
        first_at_once: bool,
        on_failure: Callable[[DatabaseError], None],
        on_crash: Callable[[BaseException], None],
    ) -> None:
        """Prepare the thread (``start()`` starts it)."""
        self._beat = beat
        self._every = every
        self._alias = alias
        self._first_at_once = first_at_once
        self._on_failure = on_failure
        self._on_crash = on_crash
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def start(self) -> None:
        """Start the thread.

        Raises:
            RuntimeError: it was already started.
        """
        if self._started:
            raise RuntimeError("a heartbeat_every object can be entered once; make a new one")
        self._started = True
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop the thread, waiting up to ``timeout`` seconds for a beat in flight; whether it ended."""
        self._stop.set()
        if not self._started:
            return True
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            if self._first_at_once and not self._once():
                return
            while not self._stop.wait(self._every):
                if not self._once():
                    return
        except BaseException as unexpected:
            self._on_crash(unexpected)
            raise
        finally:
            connections.close_all()

    def _once(self) -> bool:
        try:
            return self._beat()
        except DatabaseError as failure:
            self._on_failure(failure)
            connections[self._alias].close()
            return True


class heartbeat_every:  # a context manager named like a function, as Django's atomic
    """Context manager that keeps claims' leases renewed from a background thread until the block ends.

    Two forms, one object:

    - ``heartbeat_every(claim)``: one claim, renewed with ``heartbeat(claim)`` every ``interval`` seconds, the
      first one interval after entry. For a worker that runs one job at a time: leaving the block raises
      ``StaleClaim`` when the claim was lost.
    - ``heartbeat_every(queryset, worker=NAME, lease=30)``: every claim ``worker`` holds on the queryset's rows,
      renewed with ``heartbeat_held()`` (one statement per beat, however many claims) on entry and then every
      ``interval`` seconds. For a worker holding a batch: ask ``holds(claim)`` before starting each job.

    The thread has its own database connection, closed when it ends. A beat that fails with a database error (a
    lost connection, a lock timeout) is logged, kept in ``error`` and tried again at the next beat on a fresh
    connection; a later successful beat clears ``error``. A claim that a beat cannot renew any more because another
    claim took its row or its lease expired is added to ``lost``. Leaving the block raises, unless the block itself
    raised: ``StaleClaim`` when the claim given as a ``Claim`` was lost, else the latest beat's failure if it failed
    (the leases may have run out), or the error that stopped the thread. ``holds()`` never answers from a beat older
    than ``STALE_AFTER`` (1.5) intervals (the worker was paused, or the database unreachable): it beats first, and
    answers ``False`` if it cannot. See https://docs.djangoproject.com/en/stable/ref/databases/#connection-management.

    ``with heartbeat_every(Job.objects.all(), worker=NAME, lease=30) as beat: ...``

    Args:
        target: The ``Claim`` to keep; or the rows whose claims ``worker`` holds (a queryset, manager or model class
            of a ``Claimable`` model).
        interval: Seconds (``int``/``float``) or a ``timedelta`` between beats; positive and shorter than the lease;
            default a third of the lease.
        worker: With a queryset (required): the worker name the claims are made for.
        lease: The lease each beat sets, in seconds or a ``timedelta`` (on the database clock); default the claim's
            ``lease``; required with a queryset.
        using: With a queryset: the database alias; default the queryset's bound database, else
            ``router.db_for_write(model)``.

    Attributes:
        claim (Claim | None): The claim given as a ``Claim``, as last renewed (its ``lease_expires_at`` is the
            latest the database recorded); ``None`` for a queryset.
        held (dict): ``{pk: claim_token}`` of the claims the latest successful beat renewed.
        lost (set): The primary keys of the claims lost since the block was entered: held at a beat and, at a
            later beat, not held by the worker any more because another claim took the row or the lease expired
            (reclaimed or not). With a queryset, a claim its worker completed or released while its lease ran, or
            whose row it deleted, is not lost; nor is a row the worker holds again under a newer claim. The latest
            ``LOST_KEPT`` (1,000) are kept.
        last_beat (float | None): ``time.monotonic()`` when the latest successful beat returned; ``None`` before.
        error (BaseException | None): The failure of the latest beat, ``None`` when it succeeded.
        interval (float): Seconds between beats.
        lease (float): Seconds each beat sets.
        model, alias, worker: The claims' model, database alias and worker name.

    Raises:
        TypeError, ValueError: a bad argument (``interval`` not shorter than the lease, a non-positive one, a bad
            claim, worker name or queryset, ``worker``/``using`` with a claim), when constructed, before any SQL.
        StaleClaim: on leaving the block, when the claim given as a ``Claim`` was lost.
        DatabaseError: on leaving the block, when the latest beat failed (a ``LockError`` subclass when lockkit
            classified it), or the error that stopped the thread.
        RuntimeError: the same object entered twice.
    """

    def __init__(
        self,
        target: Claim | Any,
        interval: float | timedelta | None = None,
        *,
        worker: str | None = None,
        lease: float | timedelta | None = None,
        using: str | None = None,
    ) -> None:
        """Check the arguments; nothing runs until the block is entered."""
        self.claim: Claim | None = None
        self.held: dict[Any, int] = {}
        self._ends: dict[Any, datetime] = {}  # pk -> the lease end the latest beat set
        if isinstance(target, Claim):
            if worker is not None or using is not None:
                raise TypeError(
                    "worker and using are for a queryset: a claim carries its own worker and alias"
                )
            self.claim = inputs.claim(target)
            self.model, self.alias, self.worker = self.claim.model, self.claim.alias, self.claim.worker
            self.lease = self.claim.lease if lease is None else inputs.lease(lease)
            pk = inputs.exact_pk(self.model, self.claim.pk, "claim.pk")
            self.held = {pk: self.claim.token}
            self._ends = {pk: self.claim.lease_expires_at}
            self._candidates = self.model._base_manager.using(self.alias).filter(pk=pk)
            renew, name = self._renew_claim, f"lockkit-heartbeat-{self.claim.pk}"
        else:
            candidates = inputs.queryset(target, "target")
            self.model = inputs.claimable_model(candidates.model, "target")
            if worker is None or lease is None:
                raise TypeError(
                    "worker and lease are required with a queryset (the claims of which worker to renew)"
                )
            self.worker = inputs.worker(worker)
            self.lease = inputs.lease(lease)
            self.alias = inputs.alias_for(using, candidates)
            self._candidates = candidates.using(self.alias)
            renew, name = self._renew_held, f"lockkit-heartbeat-{self.worker}"
        self.interval = self.lease * DEFAULT_FRACTION if interval is None else duration(interval, "interval")
        if self.interval >= self.lease:
            raise ValueError(
                f"interval must be shorter than the lease ({self.lease:g}s), got {self.interval:g}s"
            )
        self.lost: set[Any] = set()
        self._lost_latest: deque[Any] = deque(
            maxlen=LOST_KEPT
        )  # lost, in the order found (the oldest goes first)
        self.last_beat: float | None = None
        self.error: BaseException | None = None
        self._renew: Callable[[], tuple[dict[Any, int], Any]] = renew
        self._stale_claim: StaleClaim | None = None  # why the claim given as a Claim was found stale
        self._clock: datetime | None = None  # the database clock of the latest successful beat
        self._crashed: BaseException | None = None
        self._lock = threading.Lock()
        self._beating = threading.Lock()
        self._beaten = threading.Event()
        self._thread = _BeatThread(
            self._scheduled,
            every=self.interval,
            alias=self.alias,
            name=name,
            first_at_once=self.claim
            is None,  # a claim carries its lease; a queryset's claims are learnt by a beat
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
        if self.claim is not None and self.lost:
            return False  # the one claim renewed here is gone for good: no beat can bring it back
        if self._stale() and not self._refresh():
            return False
        with self._lock:
            clock, tokens = self._clock, self.held
        token = tokens.get(pk)
        if token is not None:
            return held.token >= token  # a larger token: claimed again by this worker after the beat
        if self.claim is not None:
            return False  # the one claim this heartbeat renews, and the latest beat did not renew it
        if clock is None:
            return True  # no beat yet
        # Made (or renewed) within a beat interval before the beat: the beat may have run before it committed.
        moment = held.lease_expires_at - timedelta(seconds=held.lease)
        return moment >= clock - timedelta(seconds=self.interval)

    def beat(self) -> dict[Any, int]:
        """Renew now, on the calling thread's connection, and update ``held``/``lost``; return what it renewed.

        For a worker that wants ``holds()`` to know at once (after claiming a batch, before starting it); the
        thread keeps beating on its own schedule.

        Raises:
            LockError: the database failed (``ConnectionLost``, ``LockTimeout``...), as ``heartbeat_held()`` or
                ``heartbeat()`` reports it.
        """
        with self._beating:  # one beat at a time: the thread's and a caller's
            held, clock = self._renew()
            self._record(held, clock)
        return dict(held)

    def wait_for_beat(self, timeout: float) -> bool:
        """Block until a beat has succeeded since the block was entered (tests, start-up); ``False`` on timeout."""
        return self._beaten.wait(timeout)

    def __enter__(self) -> heartbeat_every:
        """Start the beating thread.

        Raises:
            RuntimeError: this object was already entered.
        """
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the thread (waiting for a beat in flight), then raise what the beats found, if anything."""
        # A beat in flight is bounded by the lock timeout; give it that long and then some.
        if not self._thread.stop(
            timeout=self.lease + 30
        ):  # pragma: no cover - a beat stuck past every timeout
            logger.error("heartbeat of %r: the beating thread did not stop in time", self.worker)
        if exc_type is not None:
            return
        if self.claim is not None and self.lost:
            held = self.claim
            raise StaleClaim(
                f"{held.model.__name__} claim pk={held.pk!r} token={held.token} was lost while the block ran: "
                f"{self._stale_claim}",
                alias=held.alias,
                claims=(held,),
            ) from self._stale_claim
        failure = self._crashed or self.error
        if failure is not None:
            raise failure

    def _renew_claim(self) -> tuple[dict[Any, int], Any]:
        """One ``heartbeat()`` of the claim given; nothing held (and no clock) once it is found stale."""
        assert self.claim is not None
        try:
            renewed = heartbeat(self.claim, lease=self.lease)
        except StaleClaim as stale:
            self._stale_claim = stale
            return {}, None
        self.claim = renewed
        return {renewed.pk: renewed.token}, renewed.lease_expires_at - timedelta(seconds=self.lease)

    def _renew_held(self) -> tuple[dict[Any, int], Any]:
        """One ``heartbeat_held()`` of the worker's claims on the queryset's rows."""
        return _renew_held(self._candidates, worker=self.worker, lease=self.lease, using=self.alias)

    def _stale(self) -> bool:
        """Whether the latest successful beat is too old to answer from (never before the first one)."""
        last = self.last_beat
        return last is not None and time.monotonic() - last > STALE_AFTER * self.interval

    def _refresh(self) -> bool:
        """Beat now on the calling thread, unless a beat in flight (waited for) made the answer fresh; success."""
        with self._beating:
            if not self._stale():  # the thread's beat, in flight when we asked, has just succeeded
                return True
            try:
                held, clock = self._renew()
            except DatabaseError as failure:
                with self._lock:
                    self.error = failure
                logger.warning(
                    "heartbeat of %r: the beat before answering holds() failed: %s", self.worker, failure
                )
                connections[self.alias].close()
                return False
            self._record(held, clock)
        return True

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
            if lost:  # a new set: a reader iterating the old one is not disturbed
                self._lost_latest.extend(lost)
                self.lost = set(self._lost_latest)
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
        row counts as ended. Without a clock (a claim's own ``heartbeat()`` found it stale) nothing ended in time.
        """
        lost: set[Any] = set()
        rows = {
            row["pk"]: row
            for row in self.model._base_manager.using(self.alias)
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
        """The thread's beat; ``False`` (stop beating) once the claim given as a ``Claim`` is lost."""
        self.beat()
        return not (self.claim is not None and self.lost)

    def _failed(self, failure: DatabaseError) -> None:
        with self._lock:
            self.error = failure
        logger.warning("heartbeat of %r failed, retrying: %s", self.worker, failure)

    def _crash(self, unexpected: BaseException) -> None:
        self._crashed = unexpected
        self.error = unexpected


__all__ = ["aheartbeat", "aheartbeat_held", "heartbeat", "heartbeat_every", "heartbeat_held"]
