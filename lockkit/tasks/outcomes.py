"""Recording an attempt's outcome: every write fenced by the claim's token, successes completed in batches.

A success, a failure, a retry (``READY`` again, ``ready_at`` after the backoff) or a return value the database
refused; each ends the claim with ``lockkit.claims.complete``/``release`` (``complete_many`` for a batch of
successes with the same value). A recorded outcome the database later lost (a failover) is noticed by the heartbeat
and its task given back (``release_forgotten``). See docs/tasks.md.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from traceback import format_exception
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, connections
from django.tasks.base import Task, TaskResultStatus
from django.tasks.signals import task_finished
from django.utils import timezone

from lockkit.claims import Claim, complete, complete_many, heartbeat_every, release
from lockkit.claims.sql import claims_sql_for
from lockkit.errors import StaleClaim
from lockkit.tasks import arguments, results, tally
from lockkit.tasks.backend import DatabaseBackend
from lockkit.tasks.models import WORKER_SEPARATOR, QueuedTask
from lockkit.tasks.options import TaskOptions

logger = logging.getLogger("lockkit.tasks.worker")

#: A success not written yet: (its values' key, row, claim, values, task).
_Done = tuple[str, QueuedTask, Claim, dict[str, Any], "Task[..., Any] | None"]


#: How many ids of finished tasks ``Stats.ids`` keeps, the latest: a worker running for months holds no more.
IDS_KEPT = 1000


@dataclass
class Stats:
    """What a worker did: tasks finished by outcome, and the ids of the latest ``IDS_KEPT`` finished (oldest first)."""

    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    lost: int = 0
    given_back: int = 0
    ids: deque[str] = field(default_factory=lambda: deque(maxlen=IDS_KEPT), repr=False)


class Outcomes:
    """Writes the outcomes of one worker's attempts (any of its threads), fenced by each claim's token.

    Args:
        worker_id: The worker's name (for the logs).
        alias: The database alias of the task rows.
        settings: The backend's checked options (``max_attempts``, ``backoff``).
        lease: The claims' lease in seconds: how long a failing write of an outcome is retried.
        batch: Successes completed together (one statement) at most.
        stats: Counted into.
    """

    def __init__(
        self, *, worker_id: str, alias: str, settings: TaskOptions, lease: float, batch: int, stats: Stats
    ) -> None:
        """Prepare (no SQL)."""
        self.worker_id = worker_id
        self.alias = alias
        self.settings = settings
        self.lease = lease
        self.batch = batch
        self.stats = stats
        self._now = claims_sql_for(QueuedTask, alias).now()
        # Successes not written yet (any thread's), all with the same values; when the oldest of them ended.
        self._done: list[_Done] = []
        self._done_since = 0.0
        self._done_lock = threading.Lock()
        # Claims this worker ended (pk -> (claim, when)), until a later beat shows the database agrees.
        self._ended: dict[Any, tuple[Claim, float]] = {}
        self._ended_lock = threading.Lock()
        #: The claims whose outcome could not be written (given up): given back by the beat, or at exit.
        self._unwritten: dict[Any, Claim] = {}
        self._settled_by: float | None = None  # the beat the ended claims were last settled by
        #: Takes a success's outcome to write with the next claim instead (``handover.py``), or ``None``.
        self.hold: Callable[[QueuedTask, Claim, dict[str, Any], Task[..., Any] | None], None] | None = None

    def fail(
        self,
        row: QueuedTask,
        claim: Claim,
        errors: list[dict[str, Any]],
        attempt: int,
        task: Task[..., Any] | None = None,
    ) -> None:
        """The attempt failed with ``errors`` (its own last): retried (``READY`` after the backoff) or ``FAILED``."""
        if attempt < self.settings.max_attempts:
            self._retry(row, claim, errors, attempt)
        else:
            self.finish(row, claim, TaskResultStatus.FAILED, errors=errors, task=task)

    def _retry(self, row: QueuedTask, claim: Claim, errors: list[dict[str, Any]], attempt: int) -> None:
        wait = self.settings.backoff(attempt)
        values = {
            "status": TaskResultStatus.READY,
            "errors": errors,
            "ready_at": claims_sql_for(QueuedTask, self.alias).lease_end(wait),
        }
        if self._write(release, claim, values, row):
            tally.count(self.stats, row, "retried", alias=self.alias)
            logger.warning(
                "task %s: attempt %d failed with %s; retrying in %gs", row.id, attempt, _summary(errors), wait
            )

    def finish(
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
        """End the attempt as ``status`` (fenced); a batchable success may be written later, by ``flush()``."""
        values: dict[str, Any] = {
            "status": status,
            "finished_at": self._now,
            "errors": errors,
            "return_value": value,
            **(extra or {}),
        }
        if not errors and row.errors == []:
            # Nothing to change: the same assignments for every such success, so its UPDATE is compiled once.
            del values["errors"]
        if self.hold is not None and status == TaskResultStatus.SUCCESSFUL and not errors and not extra:
            self.hold(row, claim, values, task)  # written with the next claim (handover.py)
            return
        if self.batch > 1 and status == TaskResultStatus.SUCCESSFUL and not errors and not extra:
            # Successes with the same values are completed together: one statement (one commit) per batch, at
            # the latest ``flush(older_than=...)`` after the first of them ended (the worker's flushing thread).
            key = json.dumps([value, "errors" in values], sort_keys=True)
            ready: list[list[_Done]] = []
            with self._done_lock:
                if self._done and self._done[0][0] != key:
                    ready.append(self._done)
                    self._done = []
                if not self._done:
                    self._done_since = time.monotonic()
                self._done.append((key, row, claim, values, task))
                if len(self._done) >= self.batch:
                    ready.append(self._done)
                    self._done = []
            for items in ready:
                self._complete_together(items)
            return
        self.write(row, claim, values, task)

    def write(
        self, row: QueuedTask, claim: Claim, values: dict[str, Any], task: Task[..., Any] | None = None
    ) -> None:
        """Write the outcome ``values`` (``finish()``'s) now, fenced, and count it."""
        errors, value, extra = values.get("errors", []), values["return_value"], values.copy()
        for name in ("status", "finished_at", "errors", "return_value"):
            extra.pop(name, None)
        try:
            if not self._write(complete, claim, values, row, refusable=value is not None):
                return
        except _NotRecorded as refused:
            self._value_refused(row, claim, refused.failure, errors, task)
            return
        self._finished(row, values["status"], errors, value, extra, task)

    def written(
        self, row: QueuedTask, claim: Claim, values: dict[str, Any], task: Task[..., Any] | None = None
    ) -> None:
        """The success ``values`` were written with the next claim (``handover.py``): count it."""
        self._remember_ended(claim)
        self._finished(row, TaskResultStatus.SUCCESSFUL, [], values["return_value"], None, task)

    def fenced_success(
        self,
        row: QueuedTask,
        claim: Claim,
        errors: list[dict[str, Any]],
        value: Any,
        task: Task[..., Any],
        *,
        recorded: bool,
    ) -> None:
        """The task's ``fenced()`` block wrote its success (with ``errors``): count it, send ``task_finished`` once.

        ``value`` is the return value, ``recorded`` whether it was written after the block (``record_value``).
        The claim is remembered as ended, as any written outcome's: a commit the database lost (a failover) leaves
        the row ``RUNNING`` under it, and ``release_forgotten`` gives the task back rather than renewing it.
        """
        self._remember_ended(claim)
        row.return_value_recorded = recorded
        self._finished(row, TaskResultStatus.SUCCESSFUL, errors, value if recorded else None, None, task)

    def dropped(self, row: QueuedTask, error: StaleClaim) -> None:
        """The outcome was not written: the claim no longer held its row (``error``)."""
        tally.count(self.stats, row, "lost", alias=self.alias)
        logger.warning(
            "worker %s: task %s was taken by another worker; this attempt's outcome is dropped: %s",
            self.worker_id, row.id, error,
        )  # fmt: skip

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
        self.fail(row, claim, [*errors, error_entry(failure, attempt)], attempt, task)

    def flush(self, older_than: float = 0.0) -> None:
        """Complete the buffered successes (any thread's) in one fenced statement (all or none).

        Args:
            older_than: Only when the first of them ended at least this many seconds ago (0: now).

        When one of them was taken by another worker meanwhile (``StaleClaim``: nothing was written), each is
        completed on its own, so only the stale ones are dropped.
        """
        with self._done_lock:
            if not self._done or time.monotonic() - self._done_since < older_than:
                return
            items, self._done = self._done, []
        self._complete_together(items)

    def _complete_together(self, items: list[_Done]) -> None:
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
            tally.count(self.stats, row, "succeeded", alias=self.alias)
        else:
            tally.count(self.stats, row, "failed", alias=self.alias)
            # ERROR: on stderr even where the project configures no logging (as a retry's WARNING is).
            logger.error(
                "task %s (%s): FAILED after %d attempt(s), the last with %s", row.id, row.task_path,
                len(row.worker_ids), _summary(errors),
            )  # fmt: skip
        self.stats.ids.append(str(row.pk))
        if task is not None and task_finished.receivers:
            # The row as written (finished_at by this process's clock, within a round trip of the database's).
            row.status, row.errors, row.return_value = status, errors, value
            row.finished_at = timezone.now()
            if extra and "worker_log" in extra:
                row.worker_log = extra["worker_log"]
            try:
                result = results.result_of(row, task)
            except TypeError:  # its args_kwargs, edited by hand (the attempt's recorded error says so)
                logger.exception("task %s: task_finished not sent: its row cannot be read", row.id)
                return
            try:
                task_finished.send(sender=DatabaseBackend, task_result=result)
            except Exception:  # the outcome is recorded: a receiver's error changes nothing (else it escapes)
                logger.exception("task %s: a task_finished receiver failed", row.id)

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
                self.dropped(row, stale)
                return False
            except DatabaseError as failure:
                connections[self.alias].close()
                refused = isinstance(failure, (DataError, IntegrityError))  # the same values fail again
                if refusable and (refused or time.monotonic() > deadline):
                    raise _NotRecorded(failure) from failure
                if refused or time.monotonic() > deadline:
                    logger.error(
                        "worker %s: could not record task %s: %s; giving it back to run again",
                        self.worker_id, row.id, failure,
                    )  # fmt: skip
                    # Still claimed, and renewed by the heartbeat: given back by release_forgotten(), or at exit.
                    self._remember_ended(claim, unwritten=True)
                    return False
                time.sleep(0.2)

    def _remember_ended(self, ended: Claim | list[Claim], *, unwritten: bool = False) -> None:
        at = time.monotonic()
        to_python = QueuedTask._meta.pk.to_python
        with self._ended_lock:
            for claim in ended if isinstance(ended, list) else [ended]:
                self._ended[to_python(claim.pk)] = (claim, at)
                if unwritten:
                    self._unwritten[to_python(claim.pk)] = claim

    def release_forgotten(self, beat: heartbeat_every) -> None:
        """Give back the tasks whose outcome the database lost or kept refusing, so that they run again.

        A failover to an asynchronous standby (or a crash with ``synchronous_commit = off``) can lose a commit
        the worker saw succeed, and an outcome the database kept failing to write for a lease is not written: the
        row stays ``RUNNING`` under this worker's claim, and the heartbeat would renew it for as long as the
        worker lives. A beat made a full interval after the end settles each claim: renewed, it is released
        (fenced by its token; the lost attempt stays counted and is recorded as ``WorkerLost`` by the next
        claim); not renewed, it is forgotten here. A release the database fails is tried again at the next beat.
        """
        last = beat.last_beat
        if last is None or last == self._settled_by or not self._ended:
            return  # settled once per beat: a claim is settled by a beat, so the same beat settles nothing new
        self._settled_by = last
        held = beat.held
        with self._ended_lock:
            settled = [pk for pk, (_, at) in self._ended.items() if last - at > beat.interval]
            lost = [self._ended[pk][0] for pk in settled if held.get(pk) == self._ended[pk][0].token]
            for pk in settled:
                del self._ended[pk]
        for claim in lost:
            with self._ended_lock:
                unwritten = self._unwritten.pop(QueuedTask._meta.pk.to_python(claim.pk), None) is not None
            if not unwritten:
                logger.warning(
                    "worker %s: the database lost the recorded outcome of task %s (a failover or a crash lost "
                    "the commit); giving it back to run again", self.worker_id, claim.pk,
                )  # fmt: skip
            if not self._given_back(claim):
                self._remember_ended(claim, unwritten=unwritten)

    def give_back(self, row: QueuedTask, claim: Claim, *, attempted: bool) -> None:
        """Give the task back (``READY``), fenced by ``claim``'s token; not ``attempted``: the attempt is uncounted.

        A claim already ended (its outcome recorded) or taken by another worker is left alone. When the database
        fails, a claim never started is remembered as unwritten: a later beat still renewing it gives it back
        (``release_forgotten``), so it is never left renewed with no runner.
        """
        workers = None if attempted else row.worker_ids[:-1]
        if not self._given_back(claim, attempted=attempted, workers=workers) and not attempted:
            self._remember_ended(claim, unwritten=True)

    def give_back_unwritten(self) -> None:
        """Give back, when the worker stops, the tasks whose outcome it could not write (a beat did not yet)."""
        with self._ended_lock:
            claims, self._unwritten = list(self._unwritten.values()), {}
        for claim in claims:
            self._given_back(claim)

    def _given_back(self, claim: Claim, *, attempted: bool = True, workers: list[str] | None = None) -> bool:
        """Release ``claim`` as ``READY`` (fenced); ``False`` when the database failed (try again later).

        Not ``attempted``: the attempt is uncounted and ``worker_log`` is written back to ``workers``.
        """
        values: dict[str, Any] = {"status": TaskResultStatus.READY}
        if workers is not None:
            values["worker_log"] = worker_log(workers)
        try:
            release(claim, set=values, attempted=attempted)
        except StaleClaim as failure:
            logger.warning("worker %s: task %s was taken meanwhile: %s", self.worker_id, claim.pk, failure)
        except DatabaseError as failure:
            logger.warning("worker %s: could not give back task %s: %s", self.worker_id, claim.pk, failure)
            return False
        else:
            if not attempted:
                self.stats.given_back += 1
        return True


class _NotRecorded(Exception):
    """A write of an outcome with a return value failed for good (``failure``); nothing was written."""

    def __init__(self, failure: DatabaseError) -> None:
        super().__init__(str(failure))
        self.failure = failure


def worker_log(workers: list[str]) -> str:
    """The ``worker_log`` column's text for ``workers`` (one name per line)."""
    return "".join(name + WORKER_SEPARATOR for name in workers)


def _summary(errors: list[dict[str, Any]]) -> str:
    """The last error as a log line shows it: the traceback's last line (``ValueError: bad input``), cut short."""
    if not errors:
        return "no recorded error"
    last = str(errors[-1].get("traceback") or "").rstrip().rsplit("\n", 1)[-1]
    text = last or str(errors[-1].get("exception_class_path", "an error"))
    return text if len(text) <= 300 else f"{text[:297]}..."


def error_entry(failure: BaseException, attempt: int) -> dict[str, Any]:
    """One item of a task's ``errors``: ``failure`` ended attempt number ``attempt``."""
    kind = type(failure)
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        # Storable whatever the exception says (NULs, lone surrogates, megabytes): recording it must not fail.
        "traceback": arguments.storable_text("".join(format_exception(failure))),
        "attempt": attempt,
    }
