"""Running one attempt of a claimed task: check the claim, import the task, call it, and hand over its outcome.

An attempt is counted when its task is claimed (its worker is appended to ``worker_ids``); the attempts before it
that left no outcome (their worker vanished) are recorded here as ``WorkerLost``. See docs/tasks.md.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import close_old_connections, connections, transaction
from django.tasks.base import Task, TaskContext, TaskResultStatus
from django.tasks.signals import task_started

from lockkit.claims import Claim, heartbeat_every
from lockkit.tasks import arguments, results, running, tally
from lockkit.tasks.backend import DatabaseBackend
from lockkit.tasks.errors import TransactionLeftOpen
from lockkit.tasks.models import QueuedTask
from lockkit.tasks.outcomes import Outcomes, error_entry, worker_log
from lockkit.tasks.stopping import SignalsKept

logger = logging.getLogger("lockkit.tasks.worker")


class Attempts:
    """Runs attempts of one worker's claimed tasks (on any of its threads) and hands their outcomes to ``outcomes``.

    Args:
        outcomes: Where outcomes are recorded (and counted).
        beat: The worker's heartbeat, asked whether a claim is still held before its task starts.
        signals: The worker's signal handlers and alarm timer, put back after a task changed them.
    """

    def __init__(self, outcomes: Outcomes, beat: heartbeat_every, signals: SignalsKept) -> None:
        """Prepare (no SQL)."""
        self.outcomes = outcomes
        self.beat = beat
        self.signals = signals
        self.settings = outcomes.settings
        self._tasks = results.TaskCache()

    def run(self, row: QueuedTask, claim: Claim) -> None:
        """Run one attempt of ``row``'s task under ``claim``, unless the claim was lost meanwhile."""
        close_old_connections()
        try:
            if not self.beat.holds(claim):
                tally.count(self.outcomes.stats, row, "lost", alias=self.outcomes.alias)
                logger.warning(
                    "worker %s: lost the claim on task %s before starting it", self.outcomes.worker_id, row.id
                )
                # Or a beat could not confirm it: then it is still held, and renewed, so it goes back (fenced).
                self.outcomes.give_back(row, claim, attempted=False)
                return
            self._run_task(row, claim)
        finally:
            close_old_connections()

    def _run_task(self, row: QueuedTask, claim: Claim) -> None:
        workers = row.worker_ids
        attempt = len(workers)
        try:
            errors = _earlier_errors(row, workers, attempt)
        except TypeError as unreadable:  # the row's errors is not a list of errors
            self.outcomes.fail(row, claim, [error_entry(unreadable, attempt)], attempt)
            return
        try:
            task = self._tasks.task_of(row)
        except BaseException as unusable:
            # An import error, not a Task, or a module that raises SystemExit or KeyboardInterrupt when imported
            # (the worker's own SIGINT/SIGTERM handler only sets a flag): no attempt can ever succeed.
            errors.append(error_entry(unusable, attempt))
            self.outcomes.finish(row, claim, TaskResultStatus.FAILED, errors=errors)
            return
        if attempt > self.settings.max_attempts:
            # Attempts up to max_attempts died with their workers; this claim is not an attempt of its own.
            self.outcomes.finish(
                row,
                claim,
                TaskResultStatus.FAILED,
                errors=errors,
                extra={"worker_log": worker_log(workers[:-1])},
                task=task,
            )
            return
        with running.running(claim, errors) as run:
            try:
                result = results.result_of(row, task)
                task_started.send(sender=DatabaseBackend, task_result=result)
                with self.signals.task_call():  # a timer the task armed ends with it
                    value = _call(task, result, row)
                stored = arguments.json_value(value, "the return value")
            except TransactionLeftOpen as failure:
                if not failure.usable:
                    raise  # the thread's connection is stuck in the task's atomic(): the worker stops
                self.outcomes.fail(row, claim, [*errors, error_entry(failure, attempt)], attempt, task)
                return
            except BaseException as failure:
                # KeyboardInterrupt and SystemExit too: the worker's own SIGINT/SIGTERM handler only sets a flag
                # (stopping.py), so one that reaches here was raised by the task (or a receiver): its error.
                self.signals.timer_off()  # raised by the task's own timer as it ended: off before the write
                if run.completed:
                    logger.exception(
                        "task %s failed after its fenced() block committed: kept SUCCESSFUL", row.id
                    )
                    self.outcomes.fenced_success(row, claim, run.errors, None, task, recorded=False)
                    return
                self.outcomes.fail(row, claim, [*errors, error_entry(failure, attempt)], attempt, task)
                return
        if run.completed:  # the fenced() block committed: SUCCESSFUL, with or without its value
            recorded = running.record_value(run, stored)
            self.outcomes.fenced_success(row, claim, run.errors, stored, task, recorded=recorded)
            return
        self.outcomes.finish(row, claim, TaskResultStatus.SUCCESSFUL, errors=errors, value=stored, task=task)


def _call(task: Task[..., Any], result: Any, row: QueuedTask) -> Any:
    """Call ``task`` with ``row``'s arguments (and a context, if it takes one)."""
    args, kwargs = row.arguments()
    try:
        if task.takes_context:
            return task.call(TaskContext(task_result=result), *args, **kwargs)
        return task.call(*args, **kwargs)
    finally:
        _no_transaction_left(row)


def _no_transaction_left(row: QueuedTask) -> None:
    """Raise ``TransactionLeftOpen`` when the task left a transaction open on one of this thread's connections.

    The worker records the outcome on these connections: in a transaction the task left open it would never
    commit. Autocommit turned off is undone (the task's uncommitted work rolled back, with Django's public
    ``rollback()`` and ``set_autocommit()``); an ``atomic()`` block left open cannot be ended from outside it.
    """
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            raise TransactionLeftOpen(
                f"task {row.id} returned inside an atomic() block it opened on database {connection.alias!r}: "
                f"this thread's connection can never be used again; the worker stops",
                usable=False,
            )
        if connection.connection is not None and not connection.get_autocommit():
            transaction.rollback(using=connection.alias)
            transaction.set_autocommit(True, using=connection.alias)
            raise TransactionLeftOpen(
                f"task {row.id} returned with autocommit turned off on database {connection.alias!r} and its "
                f"transaction not committed: rolled back",
                usable=True,
            )


def _earlier_errors(row: QueuedTask, workers: list[str], attempt: int) -> list[dict[str, Any]]:
    """The row's recorded errors, then a ``WorkerLost`` one for each earlier attempt that left no outcome.

    Raises:
        TypeError: the row's ``errors`` is not a list of error objects (edited by hand, say); the attempt fails
            with this error, which replaces them.
    """
    recorded = row.errors or []
    if not isinstance(recorded, list) or not all(results.readable_error(e) for e in recorded):
        raise TypeError(
            f"task {row.id}: its errors must be a list of objects with an exception_class_path and a traceback "
            f"(text), got {arguments.storable_text(repr(recorded), 1000)}"
        )
    return [*recorded, *_lost_attempts(row, recorded, workers, attempt)]


def _lost_attempts(
    row: QueuedTask, recorded: list[dict[str, Any]], workers: list[str], attempt: int
) -> list[dict[str, Any]]:
    """A ``WorkerLost`` error for each earlier attempt that left no outcome (its worker vanished)."""
    numbers = {e.get("attempt") for e in recorded}
    lost = []
    for number in range(1, attempt):
        if number not in numbers:
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
