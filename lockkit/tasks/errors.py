"""The exception recorded (as a ``TaskError``) for an attempt whose worker vanished without a result."""

from __future__ import annotations


class WorkerLost(Exception):
    """A task's attempt ended without a result: its worker stopped renewing the lease.

    Never raised in your code: ``lockkit_worker`` records it in ``TaskResult.errors`` (its
    ``exception_class_path`` is ``"lockkit.tasks.errors.WorkerLost"``) when it takes a task whose previous
    worker was killed (``SIGKILL``, out of memory), frozen past the lease, or cut off from the database. The
    traceback text names the worker and the attempt. After ``max_attempts`` such attempts the task is
    ``FAILED``.
    """
