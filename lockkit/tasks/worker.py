"""The worker loop of ``manage.py lockkit_worker``: claim ready tasks, run them on threads, record each outcome.

The main thread claims (``SKIP LOCKED``, one statement per batch) and handles signals; ``concurrency`` runner
threads run tasks; one heartbeat thread renews all the worker's claims in one statement per beat. An attempt is
counted when its task is claimed (its worker is appended to ``worker_ids``), so a task that kills its worker is
``FAILED`` after ``max_attempts``. Every outcome is written fenced by the claim's token. See docs/tasks.md.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from secrets import token_hex
from traceback import format_exception
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, close_old_connections, connections
from django.db.models import F, Q, Value
from django.db.models.functions import Concat
from django.tasks.base import Task, TaskContext, TaskResultStatus
from django.tasks.signals import task_finished, task_started
from django.utils import timezone

from lockkit.claims import Claim, Claimed, complete, complete_many, heartbeat_every, release
from lockkit.claims.sql import claims_sql_for
from lockkit.errors import StaleClaim
from lockkit.tasks import arguments, results, running
from lockkit.tasks.backend import DatabaseBackend
from lockkit.tasks.leases import claim_ready
from lockkit.tasks.models import WORKER_SEPARATOR, QueuedTask
from lockkit.tasks.notify import Wakeup
from lockkit.tasks.periodic.firing import Periodic
from lockkit.validation import duration

logger = logging.getLogger("lockkit.tasks.worker")

#: The longest a worker name may be (the claim column's length less room for nothing else).
WORKER_ID_MAX_LENGTH = 255


def default_worker_id() -> str:
    """``<host>-<pid>-<random>``: unique per process, readable in ``worker_ids`` and the admin."""
    return f"{socket.gethostname()[:200]}-{os.getpid()}-{token_hex(4)}"


@dataclass
class Stats:
    """What a worker did: tasks finished by outcome."""

    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    lost: int = 0
    given_back: int = 0
    ids: list[str] = field(default_factory=list, repr=False)


class Worker:
    """Claims and runs the tasks of one backend's queues until stopped (or, in burst mode, until none is ready).

    Args:
        backend: The ``DatabaseBackend``.
        queues: The queues to take tasks from (each must be one of the backend's).
        concurrency: How many tasks run at once (threads).
        batch: The most tasks one claiming statement takes (default ``concurrency``).
        lease: The claim's lease in seconds (default the backend's ``lease`` option).
        burst: Exit once no task is ready and none is running.
        worker_id: The worker's name (default ``<host>-<pid>-<random>``).

    Raises:
        ValueError, TypeError: a bad argument (named).
    """

    def __init__(
        self,
        backend: DatabaseBackend,
        *,
        queues: Sequence[str],
        concurrency: int = 1,
        batch: int | None = None,
        lease: float | None = None,
        burst: bool = False,
        worker_id: str | None = None,
    ) -> None:
        """Check the arguments (nothing runs until ``run()``)."""
        self.backend = backend
        self.settings = backend.settings
        self.queues = list(queues)
        unknown = sorted(set(self.queues) - backend.queues) if backend.queues else []
        if not self.queues or unknown:
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
        self.worker_id = default_worker_id() if worker_id is None else worker_id
        if (
            not self.worker_id
            or len(self.worker_id) > WORKER_ID_MAX_LENGTH
            or WORKER_SEPARATOR in self.worker_id
        ):
            raise ValueError(
                f"worker_id must be 1 to {WORKER_ID_MAX_LENGTH} characters without a newline, got "
                f"{self.worker_id!r}"
            )
        self.alias = backend.database()
        self.stopping = threading.Event()
        self.stats = Stats()
        self._wake = threading.Event()
        self._pending: queue.Queue[Claimed[Any]] = queue.Queue()
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._beat: heartbeat_every | None = None
        self._local = threading.local()
        # Claims this worker ended (pk -> (claim, when)), until a later beat shows the database agrees.
        self._ended: dict[Any, tuple[Claim, float]] = {}
        self._ended_lock = threading.Lock()
        self._settled_by: float | None = None  # the beat the ended claims were last settled by
        self._tasks = results.TaskCache()
        now = claims_sql_for(QueuedTask, self.alias).now()
        self._now = now
        # Unfinished (the partial index of unfinished tasks) and due: a RUNNING row was due when claimed, and
        # only its expired claim is taken (counting the attempt); a retry is READY with ready_at ahead.
        self._candidates = QueuedTask.objects.using(self.alias).filter(
            Q(ready_at__isnull=True) | Q(ready_at__lte=now),
            status__in=(TaskResultStatus.READY, TaskResultStatus.RUNNING),
            backend_name=backend.alias,
            queue_name__in=self.queues,
        )
        self._claim_set = {
            "status": TaskResultStatus.RUNNING,
            "started_at": now,
            "last_attempted_at": now,
            "worker_log": Concat(F("worker_log"), Value(self.worker_id + WORKER_SEPARATOR)),
        }
        self._order = [F("priority").desc(), F("enqueued_at").asc()]
        self._periodic = Periodic(backend, self.alias)

    def stop(self) -> None:
        """Finish the running tasks, give back the claimed ones not started, and return from ``run()``."""
        self.stopping.set()
        self._wake.set()

    def run(self) -> Stats:
        """Work until stopped (``stop()``, ``SIGTERM``) or, with ``burst``, until no task is ready.

        Returns:
            What was done.
        """
        # One task at a time runs on the main thread: no hand-off between threads (each costs up to the GIL's
        # switch interval, 5 ms); signal handlers still run between the task's bytecodes and only set a flag.
        runners = [
            threading.Thread(target=self._runner, name=f"lockkit-tasks-runner-{n}", daemon=True)
            for n in range(self.concurrency if self.concurrency > 1 else 0)
        ]
        logger.info(
            "worker %s: queues %s of backend %r on database %r (concurrency %d, batch %d, lease %gs)",
            self.worker_id, ", ".join(self.queues), self.backend.alias, self.alias, self.concurrency,
            self.batch, self.lease,
        )  # fmt: skip
        # A burst worker never waits for new tasks: it has nothing to listen for.
        wakeup = (
            Wakeup(self.alias, self.queues, self._wake) if self.settings.notify and not self.burst else None
        )
        mine = QueuedTask.objects.using(self.alias).filter(backend_name=self.backend.alias)
        # The worker's threads start with SIGTERM/SIGINT blocked (a thread inherits its creator's mask), so the
        # kernel delivers them to the main thread: its blocking calls (a task's sleep, a query) are interrupted
        # and the handler runs at once, rather than when the main thread next runs Python code.
        masked = _block_stop_signals()
        try:
            # Beats every third of the lease (the default interval).
            beat = heartbeat_every(mine, worker=self.worker_id, lease=self.lease).__enter__()
            self._beat = beat
            for runner in runners:
                runner.start()
            if wakeup is not None:
                wakeup.start()
        except BaseException:
            _restore_signals(masked)
            if self._beat is not None:
                _stop_beating(self._beat)
            raise
        _restore_signals(masked)
        try:
            self._loop()
        finally:
            self.stopping.set()
            for runner in runners:
                runner.join(timeout=None)
            try:
                self._give_back()
            finally:
                if wakeup is not None:
                    wakeup.stop()
                _stop_beating(beat)
                connections.close_all()
        logger.info("worker %s: stopped (%s)", self.worker_id, self.stats)
        return self.stats

    def _run_pending_here(self) -> None:
        """Run the claimed tasks on this (the main) thread, until stopped (the rest are given back)."""
        try:
            while not self.stopping.is_set():
                try:
                    item = self._pending.get_nowait()
                except queue.Empty:
                    return
                with self._busy_lock:
                    self._busy += 1
                try:
                    self._attempt(*item)
                finally:
                    with self._busy_lock:
                        self._busy -= 1
        finally:
            self._flush()

    def _loop(self) -> None:
        runners_started = self.concurrency > 1
        failures = 0
        while not self.stopping.is_set():
            self._periodic.fire_due()
            self._release_forgotten()
            idle = self.concurrency - self._busy_count() - self._pending.qsize()
            claimed: list[Claimed[Any]] = []
            if idle > 0:
                try:
                    claimed = self._claim(max(self.batch, idle))
                    failures = 0
                except DatabaseError as failure:
                    failures += 1
                    logger.warning("worker %s: claiming failed, retrying: %s", self.worker_id, failure)
                    connections[self.alias].close()
                    self._wake.wait(min(self.settings.poll_interval, 0.1 * 2**failures))
                    self._wake.clear()
                    continue
            for item in claimed:
                self._pending.put(item)
            if claimed and not runners_started:
                self._run_pending_here()
            if claimed:
                continue
            if self.burst and idle == self.concurrency:
                return  # nothing ready, nothing running, nothing waiting
            self._wake.wait(self.settings.poll_interval)
            self._wake.clear()

    def _claim(self, limit: int) -> list[Claimed[Any]]:
        found = claim_ready(
            self._candidates,
            worker=self.worker_id,
            lease=self.lease,
            limit=limit,
            values=self._claim_set,
            order_by=self._order,
        )
        return found

    def _busy_count(self) -> int:
        with self._busy_lock:
            return self._busy

    def _runner(self) -> None:
        try:
            while True:
                try:
                    item = self._pending.get(timeout=0.05)
                except queue.Empty:
                    self._flush()
                    if self.stopping.is_set():
                        return
                    continue
                if self.stopping.is_set():
                    self._pending.put(item)  # given back by the main thread
                    return
                with self._busy_lock:
                    self._busy += 1
                try:
                    self._attempt(*item)
                    if self._pending.empty():
                        self._flush()
                finally:
                    with self._busy_lock:
                        self._busy -= 1
                    self._wake.set()
        finally:
            try:
                self._flush()
            finally:
                connections.close_all()

    def _attempt(self, row: QueuedTask, claim: Claim) -> None:
        assert self._beat is not None
        close_old_connections()
        try:
            if not self._still_held(claim):
                self.stats.lost += 1
                logger.warning(
                    "worker %s: lost the claim on task %s before starting it", self.worker_id, row.id
                )
                return
            self._run_task(row, claim)
        finally:
            close_old_connections()

    def _still_held(self, claim: Claim) -> bool:
        assert self._beat is not None
        return self._beat.holds(claim)

    def _run_task(self, row: QueuedTask, claim: Claim) -> None:
        workers = row.worker_ids
        attempt = len(workers)
        errors = list(row.errors or [])
        errors += _lost_attempts(row, workers, attempt)
        try:
            task = self._tasks.task_of(row)
        except Exception as unusable:  # an import error or not a Task: no attempt can ever succeed
            errors.append(_error(unusable, attempt))
            self._finish(row, claim, TaskResultStatus.FAILED, errors=errors)
            return
        if attempt > self.settings.max_attempts:
            # Attempts up to max_attempts died with their workers; this claim is not an attempt of its own.
            self._finish(
                row,
                claim,
                TaskResultStatus.FAILED,
                errors=errors,
                extra={"worker_log": _log(workers[:-1])},
                task=task,
            )
            return
        result = results.result_of(row, task)
        task_started.send(sender=DatabaseBackend, task_result=result)
        with running.running(claim) as run:
            try:
                value = _call(task, result, row)
                stored = arguments.json_value(value, "the return value")
            except KeyboardInterrupt:
                raise
            except BaseException as failure:  # SystemExit too: a task cannot stop its worker
                if run.completed:
                    logger.exception(
                        "task %s failed after its fenced() block committed: kept SUCCESSFUL", row.id
                    )
                    return
                errors.append(_error(failure, attempt))
                if attempt < self.settings.max_attempts:
                    self._retry(row, claim, errors, attempt)
                else:
                    self._finish(row, claim, TaskResultStatus.FAILED, errors=errors, task=task)
                return
        if run.completed:
            try:
                QueuedTask.objects.using(self.alias).filter(
                    pk=row.pk, claim_token=claim.token, status=TaskResultStatus.SUCCESSFUL
                ).update(return_value=stored)
            except DatabaseError as failure:  # the fenced() block committed: SUCCESSFUL, without its value
                logger.error("task %s: SUCCESSFUL but its return value was not stored: %s", row.id, failure)
            self.stats.succeeded += 1
            self.stats.ids.append(str(row.pk))
            return
        self._finish(row, claim, TaskResultStatus.SUCCESSFUL, errors=errors, value=stored, task=task)

    def _retry(self, row: QueuedTask, claim: Claim, errors: list[dict[str, Any]], attempt: int) -> None:
        wait = self.settings.backoff(attempt)
        values = {
            "status": TaskResultStatus.READY,
            "errors": errors,
            "ready_at": claims_sql_for(QueuedTask, self.alias).lease_end(wait),
        }
        if self._write(release, claim, values, row):
            self.stats.retried += 1
            logger.info("task %s: attempt %d failed; retrying in %gs", row.id, attempt, wait)

    def _finish(
        self,
        row: QueuedTask,
        claim: Claim,
        status: TaskResultStatus,
        *,
        errors: list[dict[str, Any]],
        value: Any = None,
        extra: dict[str, Any] | None = None,
        task: Task[..., Any] | None = None,
    ) -> None:
        values: dict[str, Any] = {
            "status": status,
            "finished_at": self._now,
            "errors": errors,
            "return_value": value,
            **(extra or {}),
        }
        if self.batch > 1 and status == TaskResultStatus.SUCCESSFUL and not errors and not extra:
            # Successes with the same values are completed together: one statement (one commit) per batch.
            done = self._done()
            key = json.dumps(value, sort_keys=True)
            if done and done[0][0] != key:
                self._flush()
            done.append((key, row, claim, values, task))
            if len(done) >= self.batch:
                self._flush()
            return
        try:
            if not self._write(complete, claim, values, row, refusable=value is not None):
                return
        except _NotRecorded as refused:
            self._value_refused(row, claim, refused.failure, errors, task)
            return
        self._finished(row, status, errors, value, extra, task)

    def _value_refused(
        self,
        row: QueuedTask,
        claim: Claim,
        failure: DatabaseError,
        errors: list[dict[str, Any]],
        task: Task[..., Any] | None,
    ) -> None:
        """The database refused a return value (too large, say): the attempt failed with that error instead."""
        logger.error("task %s: the database refused its return value: %s", row.id, failure)
        attempt = len(row.worker_ids)
        errors = [*errors, _error(failure, attempt)]
        if attempt < self.settings.max_attempts:
            self._retry(row, claim, errors, attempt)
        else:
            self._finish(row, claim, TaskResultStatus.FAILED, errors=errors, task=task)

    def _done(self) -> list[tuple[str, QueuedTask, Claim, dict[str, Any], Task[..., Any] | None]]:
        """This thread's successes not written yet."""
        done: list[tuple[str, QueuedTask, Claim, dict[str, Any], Task[..., Any] | None]] | None
        done = getattr(self._local, "done", None)
        if done is None:
            done = self._local.done = []
        return done

    def _flush(self) -> None:
        """Complete this thread's buffered successes in one fenced statement (all or none).

        When one of them was taken by another worker meanwhile (``StaleClaim``: nothing was written), each is
        completed on its own, so only the stale ones are dropped.
        """
        done = self._done()
        if not done:
            return
        items = list(done)
        done.clear()
        values = items[0][3]
        claims = [item[2] for item in items]
        refusable = values["return_value"] is not None  # the same value for all of them
        try:
            written = self._write(
                complete_many, claims, values, items[0][1], quiet_stale=True, refusable=refusable
            )
        except StaleClaim:
            written = False
        except _NotRecorded as refused:  # their one return value was refused: so it would be one by one
            for _, row, claim, _values, task in items:
                self._value_refused(row, claim, refused.failure, [], task)
            return
        for _, row, claim, values_of_one, task in items:
            try:
                recorded = written or self._write(complete, claim, values_of_one, row, refusable=refusable)
            except _NotRecorded as refused:
                self._value_refused(row, claim, refused.failure, [], task)
                continue
            if recorded:
                self._finished(
                    row, TaskResultStatus.SUCCESSFUL, [], values_of_one["return_value"], None, task
                )

    def _finished(
        self,
        row: QueuedTask,
        status: TaskResultStatus,
        errors: list[dict[str, Any]],
        value: Any,
        extra: dict[str, Any] | None,
        task: Task[..., Any] | None,
    ) -> None:
        if status == TaskResultStatus.SUCCESSFUL:
            self.stats.succeeded += 1
        else:
            self.stats.failed += 1
        self.stats.ids.append(str(row.pk))
        if task is not None and task_finished.receivers:
            # The row as written (finished_at by this process's clock, within a round trip of the database's).
            row.status, row.errors, row.return_value = status, errors, value
            row.finished_at = timezone.now()
            if extra and "worker_log" in extra:
                row.worker_log = extra["worker_log"]
            task_finished.send(sender=DatabaseBackend, task_result=results.result_of(row, task))

    def _write(
        self,
        end: Any,
        claim: Any,
        values: dict[str, Any],
        row: QueuedTask,
        *,
        quiet_stale: bool = False,
        refusable: bool = False,
    ) -> bool:
        """End the claim(s) with ``values`` (fenced); ``False`` when the claim was lost (nothing written).

        Raises:
            StaleClaim: with ``quiet_stale``, instead of logging it and returning ``False``.
            _NotRecorded: with ``refusable`` (``values`` carry a return value), when the database refused the
                values or kept failing for a lease: the caller records the attempt as failed, without them, so
                the task is not left ``RUNNING`` under claims the heartbeat keeps renewing.
        """
        deadline = time.monotonic() + self.lease
        while True:
            try:
                end(claim, set=values)
                self._remember_ended(claim)
                return True
            except StaleClaim as stale:
                if quiet_stale:
                    raise
                self.stats.lost += 1
                logger.warning(
                    "worker %s: task %s was taken by another worker; this attempt's outcome is dropped: %s",
                    self.worker_id, row.id, stale,
                )  # fmt: skip
                return False
            except DatabaseError as failure:
                connections[self.alias].close()
                refused = isinstance(failure, (DataError, IntegrityError))  # the same values fail again
                if refusable and (refused or time.monotonic() > deadline):
                    raise _NotRecorded(failure) from failure
                if refused or time.monotonic() > deadline:
                    logger.error("worker %s: could not record task %s: %s", self.worker_id, row.id, failure)
                    return False
                time.sleep(0.2)

    def _remember_ended(self, ended: Claim | list[Claim]) -> None:
        at = time.monotonic()
        to_python = QueuedTask._meta.pk.to_python
        with self._ended_lock:
            for claim in ended if isinstance(ended, list) else [ended]:
                self._ended[to_python(claim.pk)] = (claim, at)

    def _release_forgotten(self) -> None:
        """Give back the tasks whose recorded outcome the database lost, so that they run again.

        A failover to an asynchronous standby (or a crash with ``synchronous_commit = off``) can lose a commit
        the worker saw succeed: the row is back to ``RUNNING`` under this worker's claim, and the heartbeat would
        renew it for as long as the worker lives. A beat made a full interval after the end settles each claim:
        renewed, it is released (fenced by its token; the lost attempt stays counted and is recorded as
        ``WorkerLost`` by the next claim); not renewed, it is forgotten here.
        """
        assert self._beat is not None
        last = self._beat.last_beat
        if last is None or last == self._settled_by or not self._ended:
            return  # settled once per beat: a claim is settled by a beat, so the same beat settles nothing new
        self._settled_by = last
        held = self._beat.held
        with self._ended_lock:
            settled = [pk for pk, (_, at) in self._ended.items() if last - at > self._beat.interval]
            lost = [self._ended[pk][0] for pk in settled if held.get(pk) == self._ended[pk][0].token]
            for pk in settled:
                del self._ended[pk]
        for claim in lost:
            logger.warning(
                "worker %s: the database lost the recorded outcome of task %s (a failover or a crash lost "
                "the commit); giving it back to run again", self.worker_id, claim.pk,
            )  # fmt: skip
            try:
                release(claim, set={"status": TaskResultStatus.READY})
            except (StaleClaim, DatabaseError) as failure:
                logger.warning(
                    "worker %s: could not give back task %s: %s", self.worker_id, claim.pk, failure
                )

    def _give_back(self) -> None:
        """Release the claimed tasks no runner started (SIGTERM): their attempt is not counted."""
        while True:
            try:
                row, claim = self._pending.get_nowait()
            except queue.Empty:
                return
            values = {"status": TaskResultStatus.READY, "worker_log": _log(row.worker_ids[:-1])}
            try:
                release(claim, set=values, attempted=False)
                self.stats.given_back += 1
            except (StaleClaim, DatabaseError) as failure:
                logger.warning("worker %s: could not give back task %s: %s", self.worker_id, row.id, failure)


class _NotRecorded(Exception):
    """A write of an outcome with a return value failed for good (``failure``); nothing was written."""

    def __init__(self, failure: DatabaseError) -> None:
        super().__init__(str(failure))
        self.failure = failure


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _stop_beating(beat: heartbeat_every) -> None:
    """Stop the heartbeat; a failure of its last beat is logged, not raised (the claims ended or will expire)."""
    try:
        beat.__exit__(None, None, None)
    except DatabaseError as failure:
        logger.warning("the last heartbeat failed: %s", failure)


def _block_stop_signals() -> set[int] | None:
    """Block SIGTERM/SIGINT on this thread if it is the main thread (POSIX); the previous mask, else ``None``."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return None
    return {int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)}


def _restore_signals(previous: set[int] | None) -> None:
    if previous is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _log(workers: list[str]) -> str:
    return "".join(name + WORKER_SEPARATOR for name in workers)


def _call(task: Task[..., Any], result: Any, row: QueuedTask) -> Any:
    args, kwargs = row.arguments()
    if task.takes_context:
        return task.call(TaskContext(task_result=result), *args, **kwargs)
    return task.call(*args, **kwargs)


def _error(failure: BaseException, attempt: int) -> dict[str, Any]:
    kind = type(failure)
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        # Storable whatever the exception says (NULs, lone surrogates, megabytes): recording it must not fail.
        "traceback": arguments.storable_text("".join(format_exception(failure))),
        "attempt": attempt,
    }


def _lost_attempts(row: QueuedTask, workers: list[str], attempt: int) -> list[dict[str, Any]]:
    """A ``WorkerLost`` error for each earlier attempt that left no outcome (its worker vanished)."""
    recorded = {e.get("attempt") for e in row.errors or []}
    lost = []
    for number in range(1, attempt):
        if number not in recorded:
            name = workers[number - 1] if number - 1 < len(workers) else "?"
            lost.append(
                {
                    "exception_class_path": "lockkit.tasks.errors.WorkerLost",
                    "traceback": (
                        f"lockkit.tasks.errors.WorkerLost: attempt {number} of task {row.id} by worker {name!r} "
                        f"ended without a result: the worker stopped renewing its lease (killed, frozen past the "
                        f"lease, or cut off from the database) and the lease expired\n"
                    ),
                    "attempt": number,
                }
            )
    return lost


def _positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value
