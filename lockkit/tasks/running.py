"""What a task run by ``lockkit_worker`` can ask about its own run: its claim, and a fenced scope for its writes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError
from django.tasks.base import TaskResultStatus
from django.tasks.signals import task_finished, task_started

from lockkit.claims import Claim, complete
from lockkit.claims import fenced as fenced_claim
from lockkit.claims.sql import claims_sql_for
from lockkit.guarded import guarded_update
from lockkit.scopes.blocks import locked
from lockkit.scopes.scope import LockScope
from lockkit.tasks.backend import DatabaseBackend
from lockkit.tasks.models import QueuedTask

logger = logging.getLogger("lockkit.tasks.worker")


@dataclass
class Run:
    """The task being run on this thread: its claim, its errors so far, and whether ``fenced()`` completed it.

    ``errors`` are the row's errors as the completion writes them (the ``WorkerLost`` of earlier attempts included).
    """

    claim: Claim
    errors: list[dict[str, Any]] = field(default_factory=list)
    completed: bool = False
    inside: bool = False  # a fenced() block of this run is open

    def complete(self) -> None:
        """The ``fenced()`` block's completion committed (its scope's ``on_commit``)."""
        self.completed = True


@dataclass
class Elsewhere:
    """A task another backend runs at once in this thread (Django's ``ImmediateBackend``): no claim, no row.

    Its ``fenced()`` is a plain ``locked()`` scope, held to the worker's rules (once per task, never nested), so
    that a project's tests under ``ImmediateBackend`` catch what the worker refuses.
    """

    used: bool = False
    inside: bool = False


_current: ContextVar[Run | None] = ContextVar("lockkit_tasks_run", default=None)
_elsewhere: ContextVar[Elsewhere | None] = ContextVar("lockkit_tasks_elsewhere", default=None)
# What a task another backend runs at once hides (a worker's run, when a worker's task enqueued it there: that task
# is not the claimed one, and its fenced() and current_claim() must not take it), restored when it finishes.
_hidden: ContextVar[tuple[tuple[Run | None, Elsewhere | None], ...]] = ContextVar(
    "lockkit_tasks_hidden", default=()
)


def _another_backend_starts(sender: object, **kwargs: Any) -> None:
    """``task_started`` of a backend that runs the task in the caller's thread: no worker's run while it runs."""
    if sender is not DatabaseBackend:
        _hidden.set((*_hidden.get(), (_current.get(), _elsewhere.get())))
        _current.set(None)
        _elsewhere.set(Elsewhere())


def _another_backend_finishes(sender: object, **kwargs: Any) -> None:
    """``task_finished`` of such a backend: what it hid is current again."""
    hidden = _hidden.get()
    if sender is not DatabaseBackend and hidden:
        _hidden.set(hidden[:-1])
        _current.set(hidden[-1][0])
        _elsewhere.set(hidden[-1][1])


def _refuse_reuse(used: bool, inside: bool) -> None:
    """``fenced()`` once per task run, never inside its own open block."""
    if used:
        raise RuntimeError("lockkit.tasks.fenced() was already used by this task run: use it once")
    if inside:
        # Under the worker, the inner block would complete the claim inside the outer one's transaction, which the
        # outer block's own completion then rolls back: the run would count as completed with nothing committed.
        raise RuntimeError(
            "lockkit.tasks.fenced() is already open in this task run: nested fenced() blocks are refused (write "
            "with the scope the open block yielded)"
        )


def connect_receivers() -> None:
    """Hide the worker's run while another backend runs a task inside it (from ``TasksConfig.ready()``)."""
    task_started.connect(_another_backend_starts, dispatch_uid="lockkit.tasks.running.another_backend_starts")
    task_finished.connect(
        _another_backend_finishes, dispatch_uid="lockkit.tasks.running.another_backend_finishes"
    )


def current_claim() -> Claim:
    """The ``lockkit.claims.Claim`` of the task this thread is running under ``lockkit_worker``.

    ``(claim.pk, claim.token)`` is an idempotency key for the attempt's external effects (an HTTP call, an
    e-mail): a retry of the same task carries a new token, the same attempt never does.

    Returns:
        The claim.

    Raises:
        RuntimeError: not called from a task run by ``lockkit_worker``.
    """
    run = _current.get()
    if run is None:
        raise RuntimeError("current_claim() works only inside a task run by manage.py lockkit_worker")
    return run.claim


@contextmanager
def fenced() -> Iterator[LockScope]:
    """A locked scope whose writes commit together with the task's completion, once, or not at all.

    On entry the task's row is locked and its claim checked (``lockkit.claims.fenced``): a worker whose task was
    taken by another (it froze past its lease, its claim was reclaimed) gets ``StaleClaim`` and writes nothing.
    On a normal exit the task is marked ``SUCCESSFUL`` in the same transaction (with the ``WorkerLost`` errors of
    earlier attempts), so the block's database effects happen exactly once even when a worker dies right after
    the commit (the task is not run again). The return value of the task function is written after it returns
    (a lost connection is reconnected, per the retry policy); until it is, and for good when the worker dies in
    between, the result's ``return_value`` raises ``lockkit.tasks.ReturnValueNotRecorded`` rather than answer
    ``None``. An exception raised after the block committed is logged, and the task stays ``SUCCESSFUL`` (inside the
    task's own ``atomic()``, the block commits with it, and not when it rolls back). Use it at most
    once per task, around its database writes.
    See https://docs.djangoproject.com/en/6.0/topics/db/transactions/.

    Outside a task run by ``lockkit_worker`` (Django's ``ImmediateBackend`` in tests, a direct ``task.call()``)
    there is no claim to fence and no task row to complete: the block is a plain ``lockkit.locked()`` scope on the
    default database, committed (or rolled back) with it, and the task's code runs unchanged. So is a task that
    another backend runs at once inside a worker's task (an ``ImmediateBackend`` enqueue there): it is not the
    claimed task, whose own ``fenced()`` is still to come. In a task such a backend runs, the block is held to the
    worker's rules (a second or a nested ``fenced()`` raises ``RuntimeError``), so tests catch what the worker refuses.

    Yields:
        The ``LockScope`` (write with the ORM on ``scope.alias``, or with the scope's helpers).

    Raises:
        RuntimeError: called twice in one task run (by the worker, or by a backend that runs tasks at once), or
            inside its own open block (nested).
        lockkit.errors.StaleClaim: the task's claim is no longer current; nothing was written.
    """
    run = _current.get()
    if run is None:
        with _elsewhere_scope(_elsewhere.get()) as scope:
            yield scope
        return
    _refuse_reuse(run.completed, run.inside)
    run.inside = True
    try:
        with fenced_claim(run.claim) as scope:
            yield scope
            now = claims_sql_for(run.claim.model, run.claim.alias).now()
            complete(
                run.claim,
                set={
                    "status": TaskResultStatus.SUCCESSFUL,
                    "finished_at": now,
                    "return_value": None,
                    "return_value_recorded": False,
                    "errors": run.errors,
                },
            )
            # Completed when the transaction commits: inside the task's own atomic() on the alias, that is when
            # the atomic() does, and never when it rolls back (the row is then still RUNNING under the claim).
            scope.on_commit(run.complete)
    finally:
        run.inside = False


@contextmanager
def _elsewhere_scope(elsewhere: Elsewhere | None) -> Iterator[LockScope]:
    """``fenced()`` outside a worker's run: a ``locked()`` scope, once per task another backend runs."""
    if elsewhere is None:  # not in a task (a direct call): nothing to hold it to
        with locked() as scope:
            yield scope
        return
    _refuse_reuse(elsewhere.used, elsewhere.inside)
    elsewhere.inside = True
    try:
        with locked() as scope:
            yield scope
        elsewhere.used = True
    finally:
        elsewhere.inside = False


def record_value(run: Run, value: Any) -> bool:
    """Write the return value of a task its ``fenced()`` block completed; ``False`` when it could not be written.

    One conditional ``UPDATE`` (``lockkit.guarded_update``: the row, this claim's token, ``SUCCESSFUL``), retried
    on a lost connection as the retry policy says. A value not written leaves ``return_value_recorded`` false,
    which the result reports (``ReturnValueNotRecorded``); the failure is logged.
    """
    claim = run.claim
    rows = QueuedTask.objects.using(claim.alias).filter(
        pk=claim.pk, claim_token=claim.token, status=TaskResultStatus.SUCCESSFUL
    )
    try:
        written = guarded_update(rows, return_value=value, return_value_recorded=True)
    except DatabaseError as failure:
        logger.error("task %s: SUCCESSFUL but its return value was not recorded: %s", claim.pk, failure)
        return False
    if not written:
        logger.error("task %s: SUCCESSFUL but its return value was not recorded: the row changed", claim.pk)
    return bool(written)


@contextmanager
def running(claim: Claim, errors: list[dict[str, Any]]) -> Iterator[Run]:
    """Make ``claim`` this thread's current task run for the duration of the block (the worker's side).

    ``errors`` are the row's errors so far, written by ``fenced()``'s completion.
    """
    run = Run(claim, list(errors))
    token = _current.set(run)
    hidden = _hidden.set(())
    try:
        yield run
    finally:
        _hidden.reset(hidden)
        _current.reset(token)
