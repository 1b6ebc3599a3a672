"""The worker loop of ``manage.py lockkit_worker``: claim ready tasks, run them on threads, give back the unstarted.

The main thread claims (``SKIP LOCKED``, one statement per batch) and handles signals; ``concurrency`` runner
threads run tasks (``attempt.py``); one heartbeat thread renews all the worker's claims in one statement per beat.
Every outcome is written fenced by the claim's token (``outcomes.py``). See docs/tasks.md.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from secrets import token_hex
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import F, Q, QuerySet, Value
from django.db.models.functions import Concat
from django.db.transaction import TransactionManagementError
from django.tasks.base import TaskResultStatus

from lockkit._engine import prepared
from lockkit.claims import Claim, Claimed, heartbeat_every
from lockkit.claims.api import NextClaims
from lockkit.claims.sql import claims_sql_for, zoneless
from lockkit.errors import ConnectionLost
from lockkit.tasks.attempt import Attempts
from lockkit.tasks.backend import DatabaseBackend
from lockkit.tasks.handover import Handover
from lockkit.tasks.models import WORKER_SEPARATOR, QueuedTask
from lockkit.tasks.notify import Wakeup
from lockkit.tasks.outcomes import Outcomes, Stats
from lockkit.tasks.periodic.firing import Periodic
from lockkit.tasks.stopping import SignalsKept, block_stop_signals, restore_signals, stop_on_signals
from lockkit.validation import duration

__all__ = ["WORKER_ID_MAX_LENGTH", "Stats", "Worker", "default_worker_id"]

logger = logging.getLogger("lockkit.tasks.worker")

#: Claims failing this many times in a row stop a drain (``burst``); a lost connection stops it at once.
DRAIN_FAILURES = 3

#: The longest a worker name may be (the claim column's length less room for nothing else).
WORKER_ID_MAX_LENGTH = 255

#: The longest interval between two heartbeats, whatever the lease: what a worker keeps of the claims it ended
#: since its latest beat (to notice an outcome the database lost) grows with the interval, by tasks per second.
BEAT_AT_MOST = 10.0

#: Seconds a success completed in a batch may wait for the batch to fill: then it is written anyway.
SUCCESS_WRITTEN_AFTER = 0.1


def default_worker_id() -> str:
    """``<host>-<pid>-<random>``: unique per process, readable in ``worker_ids`` and the admin."""
    return f"{socket.gethostname()[:200]}-{os.getpid()}-{token_hex(4)}"


class Worker:
    """Claims and runs the tasks of one backend's queues until stopped (or, in burst mode, until none is ready).

    Args:
        backend: The ``DatabaseBackend``.
        queues: The queues to take tasks from (each must be one of the backend's), or ``"*"``: every queue of
            the backend's ``QUEUES``, or any queue name when ``QUEUES`` is empty (Django's "any queue").
        exclude_queues: With ``queues="*"``, queues not to take tasks from.
        concurrency: How many tasks run at once (threads).
        batch: The most tasks one claiming statement takes (default ``concurrency``).
        lease: The claim's lease in seconds (default the backend's ``lease`` option).
        burst: Exit once no task is ready and none is running.
        max_tasks: Exit once this many tasks were claimed and ended (``None``: no limit); it never claims more.
        poll_interval: Seconds an idle worker waits before looking for ready tasks again (default the backend's
            ``poll_interval`` option); on PostgreSQL a ``NOTIFY`` wakes it sooner.
        worker_id: The worker's name (default ``<host>-<pid>-<random>``).
        periodic: Fire the backend's periodic schedules (``False``: none; other workers fire them).

    Raises:
        ValueError, TypeError: a bad argument (named).
        django.core.exceptions.ImproperlyConfigured: a periodic schedule's task cannot be resolved, or two
            schedules have one name.
        ImportError: an app's ``tasks`` module, or one of the ``task_modules`` option, fails to import (the
            worker imports them for their ``@periodic_task`` declarations).
    """

    def __init__(
        self,
        backend: DatabaseBackend,
        *,
        queues: Sequence[str],
        exclude_queues: Sequence[str] = (),
        concurrency: int = 1,
        batch: int | None = None,
        lease: float | None = None,
        burst: bool = False,
        max_tasks: int | None = None,
        poll_interval: float | None = None,
        worker_id: str | None = None,
        periodic: bool = True,
    ) -> None:
        """Check the arguments (nothing runs until ``run()``)."""
        self.backend = backend
        self.settings = backend.settings
        every = queues == "*"
        if isinstance(queues, str) and not every:
            raise TypeError(f"queues must be a list of queue names, or '*' for every queue, got {queues!r}")
        if isinstance(exclude_queues, str) or not all(isinstance(q, str) for q in exclude_queues):
            raise TypeError(f"exclude_queues must be a list of queue names, got {exclude_queues!r}")
        self.excluded = sorted(set(exclude_queues))
        if self.excluded and not every:
            raise ValueError(f"exclude_queues can only be used with queues '*', got queues {queues!r}")
        #: Any queue name but ``excluded``: ``"*"`` on a backend whose ``QUEUES`` is empty (no filter on the queue).
        self.any_queue = every and not backend.queues
        self.queues = [q for q in (sorted(backend.queues) if every else queues) if q not in self.excluded]
        unknown = sorted(set(self.queues) - backend.queues) if backend.queues else []
        if not (self.queues or self.any_queue) or unknown:
            raise ValueError(
                f"queues must name queues of backend {backend.alias!r} ({', '.join(sorted(backend.queues))}); "
                f"got {', '.join(map(repr, unknown or self.queues)) or 'none'}"
            )
        self.concurrency = _positive(concurrency, "concurrency")
        self.batch = self.concurrency if batch is None else _positive(batch, "batch")
        self.lease = self.settings.lease if lease is None else duration(lease, "lease")
        if self.lease < 1:
            raise ValueError(f"lease must be at least 1 second, got {lease!r}")
        self.burst = burst
        self.poll_interval = (
            self.settings.poll_interval if poll_interval is None else duration(poll_interval, "poll_interval")
        )
        self.max_tasks = None if max_tasks is None else _positive(max_tasks, "max_tasks")
        self._claimed = 0  # tasks claimed so far (max_tasks)
        # The claims this worker made, {pk: (token, time.monotonic() when made)}: what a beat renewed beyond them
        # was claimed by a message whose reply was lost, and no runner holds it (``_give_back_orphans``).
        self._made: dict[Any, tuple[int, float]] = {}
        self._orphans_checked_by: float | None = None
        self._claim_failed_at: float | None = None  # a claim raised since: it may have claimed all the same
        self.worker_id = default_worker_id() if worker_id is None else worker_id
        if not isinstance(self.worker_id, str):
            raise TypeError(f"worker_id must be a string, got {type(self.worker_id).__name__}")
        if (
            not self.worker_id
            or len(self.worker_id) > WORKER_ID_MAX_LENGTH
            or WORKER_SEPARATOR in self.worker_id
            or "\x00" in self.worker_id
        ):
            raise ValueError(
                f"worker_id must be 1 to {WORKER_ID_MAX_LENGTH} characters without a newline or a NUL, got "
                f"{self.worker_id!r}"
            )
        self.alias = backend.database()
        self.stopping = threading.Event()
        self.stats = Stats()
        self._wake = threading.Event()
        self._pending: queue.Queue[Claimed[Any]] = queue.Queue()
        self._busy = 0
        self._busy_lock = threading.Lock()
        self.outcomes = Outcomes(
            worker_id=self.worker_id,
            alias=self.alias,
            settings=self.settings,
            lease=self.lease,
            batch=self.batch,
            stats=self.stats,
        )
        self._beat: heartbeat_every | None = None
        self._attempts: Attempts | None = None
        self._signals = SignalsKept()
        #: What stopped a runner that could not go on (``run()`` raises it), else ``None``.
        self.failure: BaseException | None = None
        #: Why a drain (``burst``) stopped before it ended: its claims kept failing (``run()`` raises it).
        self.drain_failure: DatabaseError | None = None
        now = claims_sql_for(QueuedTask, self.alias).now()
        if self.any_queue:
            taken = ~Q(queue_name__in=self.excluded) if self.excluded else Q()
        else:
            taken = Q(queue_name__in=self.queues)
        # Unfinished and due: a RUNNING row was due when claimed, and only its expired claim is taken (counting
        # the attempt); a retry is READY with ready_at ahead. finished_at IS NULL (true of every READY and
        # RUNNING row) is the predicate of the partial index of unfinished tasks: a condition without a value,
        # so the claim's generic plan (a prepared statement) can use that index.
        self._candidates = zoneless(
            QueuedTask.objects.using(self.alias).filter(
                Q(ready_at__isnull=True) | Q(ready_at__lte=now),
                taken,
                status__in=(TaskResultStatus.READY, TaskResultStatus.RUNNING),
                finished_at__isnull=True,
                backend_name=backend.alias,
            )
        )  # its compiled SELECT is kept without reading the time zone per claim: nothing in it depends on one
        # The next of this worker's tasks to become due (run_after, a retry's backoff), and the clock the claim
        # compares with: an idle worker wakes then, not up to a poll_interval later. In ready_at order, first row
        # only: read from the partial index of scheduled tasks where partial indexes exist, however many wait.
        self._scheduled = (
            QueuedTask.objects.using(self.alias)
            .filter(
                taken,
                status=TaskResultStatus.READY,
                finished_at__isnull=True,
                ready_at__isnull=False,
                ready_at__gt=now,
                backend_name=backend.alias,
            )
            .annotate(lockkit_clock=now)
            .order_by("ready_at")
            .values_list("ready_at", "lockkit_clock")
        )
        # Ready tasks and those whose lease expired, in one statement, the arguments checked once here: the worker
        # needs no reaper (claim_next(expired=True)).
        self._claims = NextClaims(
            self._candidates,
            worker=self.worker_id,
            lease=self.lease,
            set={
                "status": TaskResultStatus.RUNNING,
                "started_at": now,
                "last_attempted_at": now,
                "worker_log": zoneless(Concat(F("worker_log"), Value(self.worker_id + WORKER_SEPARATOR))),
            },
            order_by=[F("priority").desc(), F("enqueued_at").asc()],
            expired=True,
            fetch=True,
        )
        self._periodic = Periodic(backend, self.alias, fire=periodic)
        #: The periodic schedules this worker fires (the ``periodic`` option's, then ``@periodic_task``'s).
        self.schedules = self._periodic.schedules
        # One task at a time, claimed one at a time: its success travels with the next claim (handover.py).
        one = self.concurrency == 1 and self.batch == 1
        self._handover = (
            Handover(self.outcomes) if one and claims_sql_for(QueuedTask, self.alias).fences_in_one else None
        )

    def queues_taken(self) -> str:
        """The queues it takes tasks from, as its log shows them: ``a, b``, or ``every queue`` (``but c, d``)."""
        if not self.any_queue:
            return ", ".join(self.queues)
        return "every queue" + (f" but {', '.join(self.excluded)}" if self.excluded else "")

    def stop(self) -> None:
        """Finish the running tasks, give back the claimed ones not started (at once), and return from ``run()``."""
        self.stopping.set()
        self._wake.set()

    def run(self) -> Stats:
        """Work until stopped (``stop()``, ``SIGTERM``/``SIGINT``) or, with ``burst``, until no task is ready.

        On the main thread, ``SIGTERM`` and ``SIGINT`` call ``stop()`` while it runs (a second one exits the
        process with status 1).

        Returns:
            What was done.

        Raises:
            django.db.transaction.TransactionManagementError: called inside ``atomic()`` (on any database): a
                test's ``TestCase`` transaction, say. Nothing was claimed.
            BaseException: what stopped a runner thread that could not go on (anything its attempt did not
                record: a ``task_finished`` receiver's ``SystemExit``, say), once the other tasks finished and the
                claims were given back.
            django.db.DatabaseError: reading the claims held under its name before it started failed, or the
                first heartbeat did (nothing was claimed); with ``burst``, claiming failed for good
                (``drain_failure``: a lost connection retried for the retry policy's ``reconnect_within``, or
                ``DRAIN_FAILURES`` other failures in a row), once the tasks not started were given back where the
                database allowed.
        """
        inside = [c.alias for c in connections.all(initialized_only=True) if c.in_atomic_block]
        if inside:
            raise TransactionManagementError(
                f"a worker cannot run inside a transaction (atomic() is open on {', '.join(inside)}): its claims and "
                "outcomes commit on their own, and its tasks open transactions of their own. In a test, use "
                "django_db(transaction=True) or TransactionTestCase (not TestCase), or Django's ImmediateBackend"
            )
        # One task at a time runs on the main thread: no hand-off between threads (each costs up to the GIL's
        # switch interval, 5 ms); signal handlers still run between the task's bytecodes and only set a flag.
        runners = [
            threading.Thread(target=self._runner, name=f"lockkit-tasks-runner-{n}", daemon=True)
            for n in range(self.concurrency if self.concurrency > 1 else 0)
        ]
        # On stop(), the claimed tasks not started go back at once, not when the running ones end: a SIGKILL
        # after a grace period charges them nothing.
        giver = threading.Thread(target=self._give_back_on_stop, name="lockkit-tasks-give-back", daemon=True)
        # Successes completed in batches are written SUCCESS_WRITTEN_AFTER after they ended at the latest, even
        # while the thread that ran them runs the next task: finished, a task does not stay RUNNING (and does not
        # run again after a SIGKILL) for as long as the next one takes.
        flushers = (
            [threading.Thread(target=self._flush_aged, name="lockkit-tasks-flush", daemon=True)]
            if self.batch > 1
            else []
        )
        mine = QueuedTask.objects.using(self.alias).filter(backend_name=self.backend.alias)
        renewed = self._without_claims_found(mine)  # before any thread starts, and before the line below
        logger.info(
            "worker %s: queues %s of backend %r on database %r (concurrency %d, batch %d, lease %gs)",
            self.worker_id, self.queues_taken(), self.backend.alias, self.alias, self.concurrency,
            self.batch, self.lease,
        )  # fmt: skip
        # A burst worker never waits for new tasks: it has nothing to listen for.
        wakeup = (
            Wakeup(self.alias, None if self.any_queue else self.queues, self._wake, excluded=self.excluded)
            if self.settings.notify and not self.burst
            else None
        )
        with stop_on_signals(self.worker_id, self.stop, self.stopping):
            self._signals = SignalsKept()  # the worker's own handlers, put back when a task changed them
            masked = block_stop_signals()
            try:
                # Beats every third of the lease, every BEAT_AT_MOST seconds at most: the claims ended since a beat
                # are kept until the next (Outcomes.release_forgotten), so a long lease would keep a busy worker's.
                every = min(self.lease / 3, BEAT_AT_MOST)
                beat = heartbeat_every(
                    renewed, worker=self.worker_id, lease=self.lease, interval=every
                ).__enter__()
                self._beat = beat
                self._attempts = Attempts(self.outcomes, beat, self._signals)
                for thread in [*runners, giver, *flushers]:
                    thread.start()
                if wakeup is not None:
                    wakeup.start()
            except BaseException:
                restore_signals(masked)
                self.stopping.set()
                if self._beat is not None:
                    _stop_beating(self._beat)
                raise
            restore_signals(masked)
            try:
                self._loop()
            except BaseException as failure:  # a receiver's SystemExit while recording or firing, say
                self._cannot_go_on(failure)
            finally:
                self.stopping.set()
                for thread in [*runners, giver, *flushers]:
                    thread.join(timeout=None)
                try:
                    off_stuck_connection(self._settle)
                finally:
                    if wakeup is not None:
                        wakeup.stop()
                    _stop_beating(beat)
                    connections.close_all()
        if self.failure is not None:
            logger.error(
                "worker %s: stopped by a runner that could not go on (%s)", self.worker_id, self.stats
            )
            raise self.failure
        if self.drain_failure is not None:
            raise self.drain_failure
        logger.info("worker %s: stopped (%s)", self.worker_id, self.stats)
        return self.stats

    def _without_claims_found(self, mine: QuerySet[QueuedTask]) -> QuerySet[QueuedTask]:
        """The rows its heartbeat renews: ``mine`` less the claims held under its name before it started.

        A worker restarted with the same ``worker_id`` (``--worker-id`` in a unit file) would otherwise renew, at
        every beat, the claims of the worker that died before it under that name, and their tasks would stay
        ``RUNNING`` for as long as it runs. Each claim found is left out by its row and token: a dead worker's
        lease runs out and its task is taken back as any expired claim is (the attempt counted, ``WorkerLost``
        recorded); a worker still running with the same name keeps renewing its own; a later claim of the same
        row, by this worker or the other, has a newer token and is renewed. One statement at start; with none
        found, the heartbeat's statement is the usual one.
        """
        now = claims_sql_for(QueuedTask, self.alias).now()
        found = mine.filter(claimed_by=self.worker_id, lease_expires_at__gt=now)
        # Their pks by token: one IN list per token, not a term per claim (a --claim-batch of 1000 made SQLite refuse
        # every beat, deeper than its 1000, and took PostgreSQL seconds to plan each beat).
        claims: dict[int, list[Any]] = {}
        for pk, token, name in found.values_list("pk", "claim_token", "claimed_by"):
            if name == self.worker_id:  # a case-insensitive collation finds "W1"'s claims for "w1" too
                claims.setdefault(token, []).append(pk)
        if not claims:
            return mine
        logger.warning(
            "worker %s: %d task(s) were claimed under this worker id before it started; it leaves their leases to "
            "run out (a worker that died with this id) or to the worker still running with it (each worker "
            "running at once needs its own --worker-id)", self.worker_id, sum(map(len, claims.values())),
        )  # fmt: skip
        for token, pks in claims.items():
            mine = mine.exclude(claim_token=token, pk__in=pks)
        return mine

    def _settle(self) -> None:
        """Write the outcomes still buffered or held, and give back the claims no runner started (at the end)."""
        self.outcomes.flush()
        if self._handover is not None:
            self._handover.flush()
        self._give_back()
        self.outcomes.give_back_unwritten()

    def _run_pending_here(self) -> None:
        """Run the claimed tasks on this (the main) thread, until stopped (the rest are given back)."""
        try:
            while not self.stopping.is_set():
                try:
                    item = self._pending.get_nowait()
                except queue.Empty:
                    return
                self._run_one(item)
        except BaseException as failure:
            self._cannot_go_on(failure)
        finally:
            try:
                off_stuck_connection(self.outcomes.flush)
            except BaseException as failure:
                self._cannot_go_on(failure)

    def _loop(self) -> None:
        assert self._beat is not None
        beat = self._beat
        runners_started = self.concurrency > 1
        failures = 0
        while not self.stopping.is_set():
            self._periodic.fire_due()
            self.outcomes.release_forgotten(beat)
            self._give_back_orphans(beat)
            idle = self.concurrency - self._busy_count() - self._pending.qsize()
            left = None if self.max_tasks is None else self.max_tasks - self._claimed
            if left == 0 and idle == self.concurrency:
                return  # max_tasks claimed, and all of them ended
            claimed: list[Claimed[Any]] = []
            if idle > 0 and left != 0:
                try:
                    claimed = self._claim(
                        max(self.batch, idle) if left is None else min(max(self.batch, idle), left)
                    )
                    self._claimed += len(claimed)
                    made_at = time.monotonic()
                    for _, made in claimed:
                        self._made[QueuedTask._meta.pk.to_python(made.pk)] = (made.token, made_at)
                    failures = 0
                except DatabaseError as failure:
                    failures += 1
                    self._claim_failed_at = time.monotonic()
                    if self.burst and (isinstance(failure, ConnectionLost) or failures >= DRAIN_FAILURES):
                        # A drain (cron, CI) does not wait an outage out: it stops, and its exit status says so.
                        # A lost connection was already retried for the policy's reconnect_within in the claim.
                        logger.error(
                            "worker %s: claiming failed; the drain stops: %s", self.worker_id, failure
                        )
                        self.drain_failure = failure
                        return
                    logger.warning("worker %s: claiming failed, retrying: %s", self.worker_id, failure)
                    connections[self.alias].close()
                    self._wake.wait(min(self.poll_interval, 0.1 * 2**failures))
                    self._wake.clear()
                    continue
            for item in claimed:
                self._pending.put(item)
            if claimed and self.stopping.is_set():
                # Stopped while the claim was in the database: the give-back on stop may have run already.
                self._give_back()
                return
            if claimed and not runners_started:
                self._run_pending_here()
            if claimed:
                continue
            if self.burst and idle == self.concurrency:
                return  # nothing ready, nothing running, nothing waiting
            self._signals.put_back()  # idle: a SIGTERM handler a task changed must not wait for the next task
            # A free runner and nothing to claim: wake when the next scheduled task is due. All runners busy: one
            # that ends wakes the loop (a NOTIFY then costs no statement). Either way, wake for the next periodic
            # tick: a poll_interval longer than a schedule's period would pass ticks by.
            wait = self._idle_wait() if idle > 0 and left != 0 else self.poll_interval
            self._wake.wait(self._periodic.wait(wait))
            self._wake.clear()

    def _idle_wait(self) -> float:
        """Seconds an idle worker waits: ``poll_interval``, or until its next scheduled task is due if sooner.

        The loop shortens it further to the next periodic tick (``Periodic.wait``).

        Asked of the database (its clock decides when a task is due), one statement per idle turn; a failure is
        logged and the worker waits ``poll_interval`` (the next claim reports the database's state).
        """
        try:
            found: list[tuple[datetime | None, datetime]] = list(self._scheduled[:1])  # a new query each time
        except DatabaseError as failure:
            logger.warning("worker %s: could not read when its next task is due: %s", self.worker_id, failure)
            return self.poll_interval
        if not found:
            return self.poll_interval
        ((due, clock),) = found
        if due is None:  # never (ready_at__isnull=False): the column is nullable for the type checker
            return self.poll_interval
        # At least a millisecond: a task due now was just missed by the claim, and is claimable at the next turn.
        return min(self.poll_interval, max((due - clock).total_seconds(), 0.001))

    def _give_back_orphans(self, beat: heartbeat_every) -> None:
        """Give back the tasks claimed for this worker that no runner holds: a claim whose reply was lost.

        A claiming message whose reply is lost (and that its rows could not decide) raises, yet it may have
        claimed tasks: the heartbeat renews every claim of this worker, so they would stay ``RUNNING``, renewed,
        never run. After such a failure, at the first beat a full interval later (on this thread, which makes
        every claim and records each before the next turn), a claim the beat renewed that this worker did not
        record is released ``READY``, fenced by the token the beat saw, its attempt uncounted (it never
        started). Claims ended longer ago than a beat interval are forgotten here.
        """
        last = beat.last_beat
        if last is None or last == self._orphans_checked_by:
            return
        self._orphans_checked_by = last
        held = dict(beat.held)
        for pk, (_token, made_at) in list(self._made.items()):
            if pk not in held and last - made_at > beat.interval:
                del self._made[pk]  # ended (or lost) before that beat: no beat renews it again
        failed_at = self._claim_failed_at
        # Only after a claim raised, and from a beat a full interval later (a lost message the server was still
        # running when it failed has committed by then): another worker given the same --worker-id is never taken
        # for a lost claim while every claim succeeds.
        if failed_at is None or last - failed_at <= beat.interval:
            return
        orphans = {pk: token for pk, token in held.items() if self._made.get(pk, (None,))[0] != token}
        if not orphans:
            if self._claim_failed_at == failed_at:
                self._claim_failed_at = None
            return
        rows = QueuedTask.objects.using(self.alias).filter(pk__in=list(orphans), claimed_by=self.worker_id)
        try:
            found = list(rows)
        except DatabaseError as failure:
            logger.warning("worker %s: could not read its unrecorded claims: %s", self.worker_id, failure)
            self._orphans_checked_by = None  # again at the next turn
            return
        for row in found:
            if row.claim_token != orphans.get(row.pk):
                continue
            logger.warning(
                "worker %s: task %s was claimed by a message whose reply was lost; giving it back", self.worker_id,
                row.pk,
            )  # fmt: skip
            claim = Claim.from_row(
                {
                    "pk": row.pk, "claim_token": row.claim_token, "claimed_by": row.claimed_by,
                    "lease_expires_at": row.lease_expires_at, "attempts": row.attempts,
                },
                model=QueuedTask, alias=self.alias, lease=self.lease,
            )  # fmt: skip
            self._release(Claimed(row, claim), attempted=False)
        if self._claim_failed_at == failed_at:
            self._claim_failed_at = None  # settled: what a later failure claims is looked for after it

    def _claim(self, limit: int) -> list[Claimed[Any]]:
        with prepared.preparing():  # the same statements every time: parsed and planned once per session
            if self._handover is None:
                return self._claims.claim(limit)
            try:
                return self._handover.claim(self._claims, limit)
            except BaseException:
                stranded = self._handover.take_stranded()
                for item in stranded:  # claimed before the failure: given back when the worker stops
                    self._pending.put(item)
                self._claimed += len(stranded)
                raise

    def _busy_count(self) -> int:
        with self._busy_lock:
            return self._busy

    def _run_one(self, item: Claimed[Any]) -> None:
        """Run one claimed task; what escapes its attempt is raised once the claim went back (fenced)."""
        assert self._attempts is not None
        with self._busy_lock:
            self._busy += 1
        try:
            with self._signals.around_task():  # on the main thread: handlers a task changed are put back
                self._attempts.run(*item)
        except BaseException:

            def record() -> None:
                if self._handover is not None:
                    self._handover.flush()  # an outcome held for the next claim is recorded first
                self._release(item, attempted=True)  # left alone if its outcome was recorded

            off_stuck_connection(record)
            raise
        finally:
            with self._busy_lock:
                self._busy -= 1
            self._wake.set()

    def _cannot_go_on(self, failure: BaseException) -> None:
        """A runner (or the main thread) cannot go on: stop the worker; ``run()`` raises ``failure`` at the end.

        An attempt records whatever its task, its receivers or its row raise; what still escapes (a
        ``task_finished`` receiver's ``SystemExit``, a failure of the worker itself) ends the thread, never
        silently: the other tasks finish, the claims not started go back, and the worker exits non-zero.
        """
        logger.critical(
            "worker %s: a runner cannot go on; stopping the worker", self.worker_id, exc_info=failure
        )
        if self.failure is None:
            self.failure = failure
        self.stop()

    def _runner(self) -> None:
        try:
            while True:
                try:
                    item: Claimed[Any] | None = self._pending.get(timeout=0.05)
                except queue.Empty:
                    item = None
                if item is None:  # outside the except block: a task_finished log line would carry queue.Empty
                    off_stuck_connection(self.outcomes.flush)
                    if self.stopping.is_set():
                        return
                    continue
                if self.stopping.is_set():
                    self._release(item, attempted=False)
                    return
                self._run_one(item)
                if self._pending.empty():  # any runner's successes: never inside a block left open here
                    off_stuck_connection(self.outcomes.flush)
        except BaseException as failure:
            self._cannot_go_on(failure)
        finally:
            try:
                # The successes buffered for a batch are any runner's: after a task left an atomic() block open on
                # this thread (TransactionLeftOpen), they must not be written on its connection.
                off_stuck_connection(self.outcomes.flush)
            except BaseException as failure:
                self._cannot_go_on(failure)
            finally:
                connections.close_all()

    def _flush_aged(self) -> None:
        """Until stopped, write the successes waiting for their batch once the first waited SUCCESS_WRITTEN_AFTER."""
        try:
            while not self.stopping.wait(SUCCESS_WRITTEN_AFTER / 2):
                self.outcomes.flush(older_than=SUCCESS_WRITTEN_AFTER)
        except BaseException as failure:
            self._cannot_go_on(failure)
        finally:
            connections.close_all()

    def _give_back_on_stop(self) -> None:
        """Wait for ``stop()`` (or the end of ``run()``), then give back the claimed tasks not started."""
        try:
            self.stopping.wait()
            self._give_back()
        finally:
            connections.close_all()

    def _give_back(self) -> None:
        """Release the claimed tasks no runner started (``stop()``): their attempt is not counted."""
        while True:
            try:
                item = self._pending.get_nowait()
            except queue.Empty:
                return
            self._release(item, attempted=False)

    def _release(self, item: Claimed[Any], *, attempted: bool) -> None:
        """Give ``item``'s task back (``READY``), fenced by its token (``Outcomes.give_back``)."""
        self.outcomes.give_back(*item, attempted=attempted)


def _stop_beating(beat: heartbeat_every) -> None:
    """Stop the heartbeat; a failure of its last beat is logged, not raised (the claims ended or will expire)."""
    try:
        beat.__exit__(None, None, None)
    except DatabaseError as failure:
        logger.warning("the last heartbeat failed: %s", failure)


def _positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def off_stuck_connection(work: Callable[[], object]) -> None:
    """``work()`` on this thread, or on a thread of its own when a task left an ``atomic()`` block open here.

    Such a block can never be ended from outside it, and whatever this thread's connection writes would stay
    inside its transaction, rolled back when the connection closes: the outcomes buffered for a batch (other
    tasks' successes), the claims given back. A new thread has connections of its own (closed after).
    """
    if not any(c.in_atomic_block for c in connections.all(initialized_only=True)):
        work()
        return
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as failure:
            failures.append(failure)
        finally:
            connections.close_all()

    helper = threading.Thread(target=run, name="lockkit-tasks-off-stuck-connection")
    helper.start()
    helper.join()
    if failures:
        raise failures[0]
