"""lockkit's exception hierarchy, the ``Failure`` kinds, and ``classify()``.

Database-reported failures subclass both :class:`LockError` and Django's ``OperationalError``, so existing
``except OperationalError`` blocks keep working; misuse errors subclass ``TransactionManagementError``.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

from django.db import OperationalError
from django.db.transaction import TransactionManagementError


class Failure(enum.Enum):
    """The kinds of locking failure a database reports, named after their SQLSTATE condition names."""

    LOCK_NOT_AVAILABLE = "lock_not_available"
    LOCK_TIMEOUT = "lock_timeout"
    DEADLOCK_DETECTED = "deadlock_detected"
    SERIALIZATION_FAILURE = "serialization_failure"
    STATEMENT_TIMEOUT = "statement_timeout"
    READ_ONLY = "read_only_sql_transaction"


class LockError(Exception):
    """Base class of every lockkit error.

    Attributes:
        sqlstate: The SQLSTATE (PostgreSQL) or vendor error code as a string, or ``None`` for misuse errors.
        alias: The database alias the operation ran on, or ``None`` when unknown.
        attempts: How many attempts the operation made before this error was raised (1 when not retried).
    """

    failure: ClassVar[Failure | None] = None

    def __init__(
        self,
        message: str = "",
        *,
        sqlstate: str | None = None,
        alias: str | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.alias = alias
        self.attempts = attempts


class TransientLockError(LockError, OperationalError):
    """A failure that may not happen again: a fresh transaction that re-runs the operation can succeed."""


class LockNotAvailable(TransientLockError):
    """A row was locked by another session and the scope asked for ``NOWAIT`` (SQLSTATE 55P03)."""

    failure = Failure.LOCK_NOT_AVAILABLE


class LockTimeout(TransientLockError):
    """Waiting for a lock took longer than the scope's ``lock_timeout`` (SQLSTATE 55P03)."""

    failure = Failure.LOCK_TIMEOUT


class DeadlockDetected(TransientLockError):
    """The database broke a deadlock by aborting this transaction (SQLSTATE 40P01)."""

    failure = Failure.DEADLOCK_DETECTED


class SerializationFailure(TransientLockError):
    """A concurrent update made this transaction impossible to serialize (SQLSTATE 40001)."""

    failure = Failure.SERIALIZATION_FAILURE


class StatementTimeout(LockError, OperationalError):
    """A statement ran longer than the scope's ``statement_timeout``, or was cancelled (SQLSTATE 57014)."""

    failure = Failure.STATEMENT_TIMEOUT


class ReadOnlyDatabase(LockError, OperationalError):
    """The alias is read-only (a hot standby, a read-only role or transaction) (SQLSTATE 25006). Never retried."""

    failure = Failure.READ_ONLY


class AliasMismatch(LockError, TransactionManagementError):
    """A queryset bound to one database alias was used in a scope opened on another."""


class NotInLockedScope(LockError, TransactionManagementError):
    """A locking helper was called outside any active ``locked()`` scope."""


class StaleClaim(LockError):
    """A job claim was used after it stopped holding its row; nothing was written. Never retried.

    The row no longer carries the claim's token, or is no longer claimed: ``reclaim_expired`` handed it back
    (and perhaps another worker claimed it), or the claim was already completed or released. The worker must
    stop working on the job: its result would overwrite the new owner's.

    Attributes:
        claims: The stale ``lockkit.claims.Claim`` objects.
    """

    def __init__(
        self,
        message: str = "",
        *,
        alias: str | None = None,
        claims: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(message, alias=alias)
        self.claims = claims


ERROR_FOR_FAILURE: dict[Failure, type[LockError]] = {
    Failure.LOCK_NOT_AVAILABLE: LockNotAvailable,
    Failure.LOCK_TIMEOUT: LockTimeout,
    Failure.DEADLOCK_DETECTED: DeadlockDetected,
    Failure.SERIALIZATION_FAILURE: SerializationFailure,
    Failure.STATEMENT_TIMEOUT: StatementTimeout,
    Failure.READ_ONLY: ReadOnlyDatabase,
}


def classify(exc: BaseException, *, nowait: bool | None = None) -> Failure | None:
    """Say which locking failure an exception reports, from the SQLSTATE or vendor code on its chain.

    The code is read from the exception and its ``__cause__``/``__context__`` chain, so Django-wrapped and bare
    driver errors (psycopg 3, psycopg2, mysqlclient, sqlite3, oracledb) classify alike. PostgreSQL reports both a
    ``NOWAIT`` failure and an expired ``lock_timeout`` as SQLSTATE 55P03 (``lock_not_available``); they are told
    apart by ``nowait``: when it is ``None``, the innermost active lockkit scope's ``nowait`` option decides, and
    outside any scope the error is reported by the code's own name (``Failure.LOCK_NOT_AVAILABLE`` for 55P03 and
    ORA-00054, ``Failure.LOCK_TIMEOUT`` for MariaDB's 1205, which MariaDB also raises for ``NOWAIT``).
    See https://www.postgresql.org/docs/current/errcodes-appendix.html.

    Args:
        exc: Any exception.
        nowait: Whether the failing statement used ``NOWAIT``; ``None`` to take it from the active scope.

    Returns:
        The ``Failure`` kind, or ``None`` when the exception is not a locking failure lockkit knows.
    """
    from lockkit.sqlstate import lookup

    if isinstance(exc, LockError):
        return exc.failure
    row = lookup(exc)
    if row is None:
        return None
    if not row.ambiguous_nowait:
        return row.failure
    if nowait is None:
        from lockkit.scope import _innermost_scope

        scope = _innermost_scope()
        if scope is None:
            return row.failure  # outside any scope: the code's own meaning
        nowait = scope.nowait
    return Failure.LOCK_NOT_AVAILABLE if nowait else Failure.LOCK_TIMEOUT
