"""What a task run by ``lockkit_worker`` can ask about its own run: its claim, and a fenced scope for its writes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.tasks.base import TaskResultStatus

from lockkit.claims import Claim, complete
from lockkit.claims import fenced as fenced_claim
from lockkit.claims.sql import claims_sql_for
from lockkit.scopes.scope import LockScope


@dataclass
class Run:
    """The task being run on this thread: its claim, and whether ``fenced()`` already completed it."""

    claim: Claim
    completed: bool = False


_current: ContextVar[Run | None] = ContextVar("lockkit_tasks_run", default=None)


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
    On a normal exit the task is marked ``SUCCESSFUL`` in the same transaction, so the block's database
    effects happen exactly once even when a worker dies right after the commit (the task is not run again).
    The return value of the task function is written after it returns; an exception raised after the block
    is logged, and the task stays ``SUCCESSFUL``. Use it at most once per task, around its database writes.
    See https://docs.djangoproject.com/en/6.0/topics/db/transactions/.

    Yields:
        The ``LockScope`` (write with the ORM on ``scope.alias``, or with the scope's helpers).

    Raises:
        RuntimeError: not called from a task run by ``lockkit_worker``, or called twice in one run.
        lockkit.errors.StaleClaim: the task's claim is no longer current; nothing was written.
    """
    run = _current.get()
    if run is None:
        raise RuntimeError("lockkit.tasks.fenced() works only inside a task run by manage.py lockkit_worker")
    if run.completed:
        raise RuntimeError("lockkit.tasks.fenced() was already used by this task run: use it once")
    with fenced_claim(run.claim) as scope:
        yield scope
        now = claims_sql_for(run.claim.model, run.claim.alias).now()
        complete(
            run.claim,
            set={"status": TaskResultStatus.SUCCESSFUL, "finished_at": now, "return_value": None},
        )
    run.completed = True


@contextmanager
def running(claim: Claim) -> Iterator[Run]:
    """Make ``claim`` this thread's current task run for the duration of the block (the worker's side)."""
    run = Run(claim)
    token = _current.set(run)
    try:
        yield run
    finally:
        _current.reset(token)
