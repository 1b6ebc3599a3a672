"""lockkit: correct, fast pessimistic locking for Django.

One alias per locked operation, transaction-scoped timeouts, SQLSTATE-classified errors, and retries only outside
the outermost atomic block. Start with ``locked()`` and ``locked_operation()``.
"""

from __future__ import annotations

from typing import Any

from lockkit import (
    inspection as inspection,  # ``lockkit.inspection.blocking()`` after a bare ``import lockkit``
)
from lockkit.advisory.api import advisory_lock
from lockkit.errors import (
    AdvisoryLockLost,
    AliasMismatch,
    CommitOutcomeUnknown,
    ConnectionLost,
    DeadlockDetected,
    Failure,
    IdleInTransactionTimeout,
    LockError,
    LockNotAvailable,
    LockTimeout,
    NotInLockedScope,
    OnCommitError,
    QueryCanceled,
    QueryInChange,
    ReadOnlyDatabase,
    SerializationFailure,
    StaleClaim,
    StatementTimeout,
    TransactionAborted,
    TransientLockError,
    UnlockedSaveWarning,
)
from lockkit.guarded import guarded_update
from lockkit.operations.operation import locked_operation
from lockkit.operations.retry import RetryEvent, RetryPolicy
from lockkit.operations.update import alocked_update, locked_update
from lockkit.priority import Prioritized, PrioritizeFailed, prioritize
from lockkit.scopes.scope import LockScope, classify, current_scope, lock, locked
from lockkit.tablemodes import TableLockMode

__version__ = "0.1.0.dev0"

__all__ = [
    "AdvisoryLockLost",
    "AliasMismatch",
    "CommitOutcomeUnknown",
    "ConnectionLost",
    "DeadlockDetected",
    "Failure",
    "IdleInTransactionTimeout",
    "LockError",
    "LockNotAvailable",
    "LockScope",
    "LockTimeout",
    "NotInLockedScope",
    "OnCommitError",
    "PrioritizeFailed",
    "Prioritized",
    "QueryCanceled",
    "QueryInChange",
    "ReadOnlyDatabase",
    "RetryEvent",
    "RetryPolicy",
    "SerializationFailure",
    "StaleClaim",
    "StatementTimeout",
    "TableLockMode",
    "TransactionAborted",
    "TransientLockError",
    "UnlockedSaveWarning",
    "__version__",
    "advisory_lock",
    "alocked_update",
    "classify",
    "current_scope",
    "guarded_update",
    "lock",
    "locked",
    "locked_operation",
    "locked_update",
    "prioritize",
]

# lockkit.claims defines a model mixin, which needs Django's app registry: its names are imported on
# first use (``lockkit.claim_next``), not when lockkit is imported (e.g. from settings). They stay out of
# ``__all__`` so that ``from lockkit import *`` never triggers that import. For precise types, import them
# from ``lockkit.claims``.
_CLAIM_NAMES = frozenset(
    {
        "Claim",
        "Claimable",
        "Claimed",
        "aclaim",
        "aclaim_next",
        "acomplete",
        "acomplete_many",
        "aheartbeat",
        "aheartbeat_worker",
        "aheld_by",
        "areclaim_expired",
        "arelease",
        "arelease_many",
        "claim",
        "claim_next",
        "complete",
        "complete_many",
        "fenced",
        "heartbeat",
        "heartbeat_every",
        "heartbeat_worker",
        "held_by",
        "reclaim_expired",
        "release",
        "release_many",
        "worker_heartbeat",
    }
)


def __getattr__(name: str) -> Any:
    if name in _CLAIM_NAMES:
        from lockkit import claims

        return getattr(claims, name)
    raise AttributeError(f"module 'lockkit' has no attribute {name!r}")
