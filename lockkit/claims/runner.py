"""Running one claims call in a short transaction of its own, like a ``locked_operation``.

The transaction is bounded by the lock timeout (``settings.LOCKKIT["LOCK_TIMEOUT"]`` or the call's
``lock_timeout=``); a dead connection is discarded before it; a connection lost before COMMIT, a deadlock and a
serialization failure are retried in a fresh transaction (nothing was written) and a loss at COMMIT is resolved (``CommitOutcomeUnknown`` when it cannot be). Inside the caller's
own ``atomic()`` it runs in a savepoint and makes one attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

from django.db import connections

from lockkit.errors import Failure
from lockkit.operation import locked_operation
from lockkit.retry import RetryPolicy

T = TypeVar("T")

# Retried in a fresh transaction: a connection lost before COMMIT, and a deadlock or serialization failure (the
# database rolled the whole transaction back: on MariaDB a claim is two statements and InnoDB's next-key locks can
# deadlock it against a completion; under REPEATABLE READ a concurrent claim of the same row is a serialization
# failure). A lock timeout is the caller's to decide on.
_RETRIED = RetryPolicy(
    retry_on={Failure.CONNECTION_LOST, Failure.DEADLOCK_DETECTED, Failure.SERIALIZATION_FAILURE}
)

#: Decorated operations by (alias, lock timeout type and value, call site); a few per process in practice.
_OPERATIONS: dict[Hashable, Callable[[Callable[[], Any]], Any]] = {}
_MAX_OPERATIONS = 256


def in_transaction(alias: str, lock_timeout: Any, work: Callable[[], T]) -> T:
    """Run ``work()`` in a locked scope on ``alias``, retried after a failure that rolled it back.

    A connection lost before COMMIT, a deadlock and a serialization failure are retried; a lost COMMIT is resolved
    first. Locks are ``FOR NO KEY UPDATE``; the scope's lock timeout is ``lock_timeout``.

    Args:
        alias: The database alias.
        lock_timeout: Seconds, ``None`` (the connection's own setting) or ``FROM_SETTINGS``.
        work: The claims statement(s) to run in the scope.

    Returns:
        What ``work()`` returned.

    Raises:
        TypeError, ValueError: ``lock_timeout`` is not a positive duration, ``None`` or the settings default.
        LockTimeout: a lock was waited for longer than the lock timeout.
        ConnectionLost: the connection was lost on every attempt for ``reconnect_within`` seconds.
        DeadlockDetected, SerializationFailure: on each of the policy's 3 attempts.
        CommitOutcomeUnknown: the connection was lost at COMMIT and the outcome could not be found out.
    """
    operation = _operation(alias, lock_timeout, work)
    return cast(T, operation(work))


def _operation(alias: str, lock_timeout: Any, work: Callable[[], Any]) -> Callable[[Callable[[], Any]], Any]:
    """The locked operation that runs a ``work`` callable, decorated once per alias, lock timeout and call site.

    Decorating per call cost more than the scope itself (options validated, a wrapper and its awaitable form
    built). The operation is named after ``work`` (the call site), as the signals report it. Settings are still
    read per call by the operation itself. A ``lock_timeout`` that cannot be a key (unhashable) is validated
    without being kept, so it raises as always.
    """
    name = getattr(work, "__qualname__", "claims")
    # Keyed by the type too: ``True == 1``, and a bool must still be refused.
    key: Hashable | None = (alias, type(lock_timeout), lock_timeout, name)
    try:
        return _OPERATIONS[key]
    except KeyError:
        pass
    except TypeError:
        key = None

    def run(work: Callable[[], Any]) -> Any:
        return work()

    run.__qualname__ = name
    run.__name__ = getattr(work, "__name__", "claims")
    run.__module__ = getattr(work, "__module__", __name__)
    # FOR NO KEY UPDATE where the database has it (PostgreSQL); MariaDB/MySQL and SQLite lock their own way.
    no_key = connections[alias].features.has_select_for_no_key_update
    operation: Callable[[Callable[[], Any]], Any] = locked_operation(
        using=alias, lock_timeout=lock_timeout, no_key=no_key, retry=_RETRIED
    )(run)
    if key is not None and len(_OPERATIONS) < _MAX_OPERATIONS:
        _OPERATIONS[key] = operation
    return operation
