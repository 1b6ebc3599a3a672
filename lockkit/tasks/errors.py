"""The exception recorded for an attempt whose worker vanished, and the one a result raises for a lost value."""

from __future__ import annotations


class WorkerLost(Exception):
    """A task's attempt ended without a result: its worker stopped renewing the lease.

    Never raised in your code: ``lockkit_worker`` records it in ``TaskResult.errors`` (its
    ``exception_class_path`` is ``"lockkit.tasks.errors.WorkerLost"``) when it takes a task whose previous
    worker was killed (``SIGKILL``, out of memory), frozen past the lease, or cut off from the database. The
    traceback text names the worker and the attempt. After ``max_attempts`` such attempts the task is
    ``FAILED``.
    """


class ReturnValueNotRecorded(ValueError):
    """A ``SUCCESSFUL`` task's return value was not recorded: raised by its ``TaskResult.return_value``.

    A task whose ``lockkit.tasks.fenced()`` block committed is ``SUCCESSFUL`` from that commit on (its database
    effects happened, it is never run again); its return value is written once the function returns. When the
    worker dies (or cannot reach the database for its retry budget) in between, the value is lost: rather than
    answer ``None``, indistinguishable from a task that returned ``None``, ``return_value`` raises this. A
    ``ValueError``, as Django's ``return_value`` raises for a task without a value.
    """


class TransactionLeftOpen(RuntimeError):
    """A task returned (or raised) with a transaction still open on its worker thread's connection.

    Recorded as the attempt's error (its ``exception_class_path`` is ``"lockkit.tasks.errors.TransactionLeftOpen"``)
    when the task turned autocommit off and did not commit: its uncommitted work is rolled back and the
    connection serves on. When the task left an ``atomic()`` block open, nothing can end that block (its
    context manager is the task's), so the thread's connection can never be used again: the worker raises this,
    gives its claims back and exits non-zero (the attempt is then ``WorkerLost``).

    Attributes:
        usable: Whether the connection was restored (autocommit turned off) and the attempt could be recorded.
    """

    def __init__(self, message: str, *, usable: bool) -> None:
        """Say what was left open; ``usable``: the connection was restored."""
        super().__init__(message)
        self.usable = usable
