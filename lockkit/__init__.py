"""lockkit: correct, fast pessimistic locking for Django.

One alias per locked operation, transaction-scoped timeouts, SQLSTATE-classified errors, and retries only outside
the outermost atomic block. Start with ``locked()`` and ``locked_operation()``.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

from django.core.exceptions import AppRegistryNotReady, ImproperlyConfigured

from lockkit import (
    inspection as inspection,  # ``lockkit.inspection.blocking()`` after a bare ``import lockkit``
)
from lockkit.advisory.api import advisory_lock
from lockkit.errors import (
    AdvisoryLockAlreadyHeld,
    AdvisoryLockError,
    AdvisoryLockLost,
    AliasMismatch,
    CommitOutcomeUnknown,
    ConnectionLost,
    DatabaseMisconfigured,
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
from lockkit.operations.update import alocked_update, locked_update
from lockkit.priority import Prioritized, PrioritizeFailed, prioritize
from lockkit.retries import RetryEvent, RetryPolicy
from lockkit.scopes.blocks import locked
from lockkit.scopes.scope import LockScope, classify
from lockkit.scopes.stack import current_scope, lock
from lockkit.tablemodes import TableLockMode

__version__ = "0.1.0.dev0"

__all__ = [
    "AdvisoryLockAlreadyHeld",
    "AdvisoryLockError",
    "AdvisoryLockLost",
    "AliasMismatch",
    "CommitOutcomeUnknown",
    "ConnectionLost",
    "DatabaseMisconfigured",
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


def __getattr__(name: str) -> Any:
    """``lockkit.claim_next`` and every other name of ``lockkit.claims.__all__``, imported on first use.

    ``lockkit.claims`` defines a model mixin, which needs Django's app registry: it is imported on first use, not
    when lockkit is imported (e.g. from settings), and its names stay out of ``__all__`` so that ``from lockkit import
    *`` never triggers that import. For precise types, import them from ``lockkit.claims``.
    """
    # A submodule's name is the import system asking before it imports the submodule (``from lockkit import x``).
    if not name.startswith("_") and find_spec(f"{__name__}.{name}") is None:
        try:
            from lockkit import claims
        except (AppRegistryNotReady, ImproperlyConfigured) as not_ready:  # settings not set up yet
            raise AttributeError(
                f"module 'lockkit' has no attribute {name!r} before Django's app registry is ready (the names of "
                f"lockkit.claims, such as lockkit.claim_next, need it): {not_ready}"
            ) from not_ready
        # Built when lockkit.claims is imported, out of mypy's sight (see lockkit/claims/__init__.py).
        if name in claims.__all__:  # type: ignore[attr-defined]
            return getattr(claims, name)
    raise AttributeError(f"module 'lockkit' has no attribute {name!r}")
