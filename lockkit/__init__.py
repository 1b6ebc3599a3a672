"""lockkit: correct, fast pessimistic locking for Django.

One alias per locked operation, transaction-scoped timeouts, SQLSTATE-classified errors, and retries only outside
the outermost atomic block. Start with ``locked()`` and ``locked_operation()``.
"""

from __future__ import annotations

from lockkit.errors import (
    AliasMismatch,
    DeadlockDetected,
    Failure,
    LockError,
    LockNotAvailable,
    LockTimeout,
    NotInLockedScope,
    ReadOnlyDatabase,
    SerializationFailure,
    StatementTimeout,
    TransientLockError,
    classify,
)
from lockkit.retry import RetryEvent, RetryPolicy
from lockkit.scope import LockScope, current_scope, lock, locked, locked_operation

__version__ = "0.1.0.dev0"

__all__ = [
    "AliasMismatch",
    "DeadlockDetected",
    "Failure",
    "LockError",
    "LockNotAvailable",
    "LockScope",
    "LockTimeout",
    "NotInLockedScope",
    "ReadOnlyDatabase",
    "RetryEvent",
    "RetryPolicy",
    "SerializationFailure",
    "StatementTimeout",
    "TransientLockError",
    "__version__",
    "classify",
    "current_scope",
    "lock",
    "locked",
    "locked_operation",
]
