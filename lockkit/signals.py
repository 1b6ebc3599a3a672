"""Django signals lockkit sends about locked operations, lock acquisitions and job claims.

Connect receivers as for any Django signal (``lockkit.signals.operation_finished.connect(receiver)``); every
signal is sent with keyword arguments only, listed below, and receivers must accept ``**kwargs`` as Django asks. A
signal without receivers costs one attribute check on the hot path: lockkit measures nothing for it. Receivers run
synchronously in the thread of the operation, inside or right after its transaction (see each signal): keep them
fast. lockkit sends with ``Signal.send_robust``: an exception from a receiver is logged (logger
``lockkit.signals``, level ERROR) and never fails, rolls back or retries the operation. See https://docs.djangoproject.com/en/stable/topics/signals/.

Operation signals (``sender`` is the decorated function, so ``connect(receiver, sender=reserve_stock)`` listens to
one operation):

``operation_started``
    A ``locked_operation`` call begins, before its first attempt. Arguments: ``operation`` (str, the decorated
    function's qualified name), ``alias`` (str).
``attempt_started``
    An attempt begins, before its transaction. Arguments: ``operation``, ``alias``, ``attempt`` (int, 1-based).
``attempt_finished``
    An attempt ended (committed, or rolled back by an error). Arguments: ``operation``, ``alias``, ``attempt``,
    ``failure`` (``lockkit.Failure`` or ``None``: the classified kind of its error, ``None`` on success or for an
    error lockkit does not classify), ``error`` (the exception or ``None``), ``duration`` (float, seconds).
``operation_retried``
    An attempt failed and the operation will run again after ``wait``. Arguments: ``operation``, ``alias``,
    ``attempt`` (the number of the attempt that failed), ``failure``, ``sqlstate`` (str or ``None``), ``wait``
    (float, seconds), ``error``.
``operation_gave_up``
    The retry policy stopped (attempts or deadline exhausted) on a failure: the last error is raised next.
    Arguments: ``operation``, ``alias``, ``attempts`` (int), ``failure``, ``sqlstate``, ``error``.
``operation_finished``
    The call returns or raises. Arguments: ``operation``, ``alias``, ``attempts`` (int: how many attempts ran),
    ``failure`` (the kind of the raised error, ``None`` on success), ``error`` (the raised exception or ``None``),
    ``duration`` (float, seconds, all attempts and waits included).

Lock signal (``sender`` is ``lockkit.LockScope``):

``lock_acquired``
    A locking statement lockkit evaluates itself returned: ``LockScope.get()``, ``LockScope.lock_all()``,
    ``LockScope.advisory_lock()``, ``LockScope.lock_table()``. Arguments: ``alias``, ``scope`` (the ``LockScope``),
    ``model`` (the model class, or ``None`` for an advisory lock; for ``lock_table()`` the model of the first table
    in name order), ``rows`` (int, rows locked; 1 for an advisory lock, 0 for a table lock), ``wait`` (float,
    seconds the locking statement took: the lock wait plus the statement's own time). A queryset from
    ``LockScope.lock()`` is evaluated by the caller, so it is not timed.

Claim signals (``sender`` is ``lockkit.claims.Claim``):

``claim_made``
    ``claim()`` or ``claim_next()`` claimed rows (not sent when nothing was claimed). Arguments: ``claims`` (list of
    ``Claim``), ``model``, ``alias``, ``worker`` (str).
``claim_completed``, ``claim_released``
    ``complete()``/``complete_many()`` or ``release()``/``release_many()`` ended claims. Arguments: ``claims``
    (list of ``Claim``), ``model``, ``alias``.
``claim_reclaimed``
    ``reclaim_expired()`` freed expired claims. Arguments: ``model``, ``alias``, ``count`` (int, rows freed;
    sent only when it is positive).
``claim_stale``
    A fenced write (``heartbeat()``, ``complete()``, ``release()``...) found a claim lost and raised
    ``StaleClaim``. Arguments: ``claims`` (list of ``Claim``), ``model``, ``alias``, ``error`` (the ``StaleClaim``).

Task signal (``sender`` is ``lockkit.tasks.worker.Worker``):

``task_counted``
    A ``lockkit_worker`` recorded the outcome of a task's attempt. Arguments: ``backend`` (str, the alias in
    ``settings.TASKS``), ``queue`` (str), ``alias`` (str, the task table's database), ``outcome`` (str:
    ``succeeded``, ``failed`` (final), ``retried`` (failed, will run again) or ``lost`` (another worker took the
    task: this attempt's outcome was dropped)).
"""

from __future__ import annotations

from django.dispatch import Signal

operation_started = Signal()
"""A ``locked_operation`` call begins, before its first attempt: ``operation``, ``alias``."""
attempt_started = Signal()
"""An attempt begins, before its transaction: ``operation``, ``alias``, ``attempt``."""
attempt_finished = Signal()
"""An attempt ended: ``operation``, ``alias``, ``attempt``, ``failure``, ``error``, ``duration``."""
operation_retried = Signal()
"""An attempt failed and runs again: ``operation``, ``alias``, ``attempt``, ``failure``, ``sqlstate``, ``wait``, ``error``."""
operation_gave_up = Signal()
"""The retry policy stopped: ``operation``, ``alias``, ``attempts``, ``failure``, ``sqlstate``, ``error``."""
operation_finished = Signal()
"""The call returns or raises: ``operation``, ``alias``, ``attempts``, ``failure``, ``error``, ``duration``."""
lock_acquired = Signal()
"""A locking statement lockkit evaluates returned: ``alias``, ``scope``, ``model``, ``rows``, ``wait``."""
claim_made = Signal()
"""``claim()``/``claim_next()`` claimed rows: ``claims``, ``model``, ``alias``, ``worker``."""
claim_completed = Signal()
"""``complete()``/``complete_many()`` ended claims: ``claims``, ``model``, ``alias``."""
claim_released = Signal()
"""``release()``/``release_many()`` ended claims: ``claims``, ``model``, ``alias``."""
claim_reclaimed = Signal()
"""``reclaim_expired()`` freed expired claims: ``model``, ``alias``, ``count``."""
claim_stale = Signal()
"""A fenced write found a claim lost (``StaleClaim``): ``claims``, ``model``, ``alias``, ``error``."""
task_counted = Signal()
"""A worker recorded a task attempt's outcome: ``backend``, ``queue``, ``alias``, ``outcome``."""

__all__ = [
    "attempt_finished",
    "attempt_started",
    "claim_completed",
    "claim_made",
    "claim_reclaimed",
    "claim_released",
    "claim_stale",
    "lock_acquired",
    "operation_finished",
    "operation_gave_up",
    "operation_retried",
    "operation_started",
    "task_counted",
]
