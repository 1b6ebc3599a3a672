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
