"""lockkit's exception hierarchy, the ``Failure`` kinds, and the registry from a kind to its error class.

Each error class that stands for a database-reported failure declares its kind once (``failure = Failure.X``);
defining the class registers it, and ``error_class()`` finds it. Adding a kind touches two places: the enum and the
class here, plus its rows in ``lockkit.errorcodes.table``. This module imports nothing else from lockkit.

Database-reported failures subclass both :class:`LockError` and Django's ``OperationalError``, so existing
``except OperationalError`` blocks keep working; misuse errors subclass ``TransactionManagementError``.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

from django.db import DatabaseError, OperationalError
from django.db.transaction import TransactionManagementError


class Failure(enum.Enum):
    """The kinds of locking failure a database reports, named after their SQLSTATE condition names."""

    LOCK_NOT_AVAILABLE = "lock_not_available"
    LOCK_TIMEOUT = "lock_timeout"
    DEADLOCK_DETECTED = "deadlock_detected"
    SERIALIZATION_FAILURE = "serialization_failure"
    STATEMENT_TIMEOUT = "statement_timeout"
    READ_ONLY = "read_only_sql_transaction"
    QUERY_CANCELED = "query_canceled"
    CONNECTION_LOST = "connection_lost"
    IDLE_IN_TRANSACTION_TIMEOUT = "idle_in_transaction_session_timeout"
    DATABASE_MISCONFIGURED = "database_misconfigured"


# Filled by LockError.__init_subclass__: the one class that declares each failure kind.
_ERROR_CLASSES: dict[Failure, type[LockError]] = {}


class LockError(Exception):
    """Base class of every lockkit error.

    Attributes:
        sqlstate: The SQLSTATE (PostgreSQL) or vendor error code as a string, or ``None`` for misuse errors.
        alias: The database alias the operation ran on, or ``None`` when unknown.
        attempts: How many attempts the operation made before this error was raised (1 when not retried).
    """

    failure: ClassVar[Failure | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register a subclass that declares its own ``failure`` as the error class of that kind.

        Raises:
            TypeError: another class already declared the same ``failure``.
        """
        super().__init_subclass__(**kwargs)
        failure = cls.__dict__.get("failure")
        if failure is None:
            return
        registered = _ERROR_CLASSES.setdefault(failure, cls)
        if registered is not cls:
            raise TypeError(f"{failure} is already declared by {registered.__qualname__}")

    def __init__(
        self,
        message: str = "",
        *,
        sqlstate: str | None = None,
        alias: str | None = None,
        attempts: int = 1,
    ) -> None:
        """Build the error; every argument but ``message`` is keyword-only (see the class attributes)."""
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
    """A statement ran longer than the ``statement_timeout`` in force (SQLSTATE 57014). Never retried.

    The timeout may come from lockkit (the scope's ``statement_timeout``, ``settings.LOCKKIT["STATEMENT_TIMEOUT"]``)
    or from anywhere else: a role or database setting, ``OPTIONS={"options": "-c statement_timeout=..."}``, a
    managed platform's default, ``SET LOCAL`` in your own code. PostgreSQL reports a cancel (``pg_cancel_backend``)
    with the same code; the server's primary message tells the two apart ("canceling statement due to statement
    timeout" / "... due to user request"). A server whose ``lc_messages`` translates them gives no such sign: then it
    is a ``StatementTimeout`` when lockkit set a statement timeout, else a ``QueryCanceled``.
    """

    failure = Failure.STATEMENT_TIMEOUT


class QueryCanceled(LockError, OperationalError):
    """The statement was cancelled from outside (``pg_cancel_backend``, ``KILL QUERY``). Never retried.

    SQLSTATE 57014 reported as a cancel ("canceling statement due to user request"; see ``StatementTimeout``), or
    MariaDB/MySQL 1317: someone asked for it to stop.
    """

    failure = Failure.QUERY_CANCELED


class ConnectionLost(LockError, OperationalError):
    """The connection to the database was lost, or connecting failed.

    The server ended the session (a restart, ``pg_terminate_backend``, an idle timeout, a pooler) or the network
    failed. SQLSTATE class 08, 57P01/57P02/57P03/57P05; MariaDB/MySQL 2006, 2013, 2055, 4031, 1927; or no code at
    all, when the driver reports its connection closed or broken. A ``ConnectionLost`` raised by a scope means the
    transaction did not commit (a loss at COMMIT is resolved first, see ``CommitOutcomeUnknown``), so
    ``locked_operation`` retries it by default; lockkit has already discarded the dead connection, and the next
    call reconnects. ``sqlstate`` is ``None`` when the driver gave no code.
    """

    failure = Failure.CONNECTION_LOST


class IdleInTransactionTimeout(ConnectionLost):
    """The server ended the session because its transaction sat idle too long (SQLSTATE 25P03). Not retried by default.

    PostgreSQL's ``idle_in_transaction_session_timeout`` expired between two statements of the scope's transaction:
    the body spent longer than that outside the database (an HTTP call, a slow computation) while holding its
    transaction open. The server rolled the transaction back and closed the session: nothing committed, and lockkit
    has discarded the connection (the next call reconnects). Retrying would repeat the slow body and its external
    effects, so ``locked_operation`` does not retry it unless ``Failure.IDLE_IN_TRANSACTION_TIMEOUT`` is in
    ``retry_on``. Move the slow work out of the transaction, or raise the timeout for the role. See
    https://www.postgresql.org/docs/current/runtime-config-client.html#GUC-IDLE-IN-TRANSACTION-SESSION-TIMEOUT.

    A subclass of ``ConnectionLost``: the connection is gone either way.
    """

    failure = Failure.IDLE_IN_TRANSACTION_TIMEOUT


class CommitOutcomeUnknown(ConnectionLost):
    """The connection was lost while COMMIT was in flight and whether it committed could not be found out.

    On PostgreSQL lockkit asks the server (``pg_xact_status`` of the transaction id it recorded when the scope
    began) after reconnecting; this is raised only when that answer could not be had (the server stayed
    unreachable, or the transaction was still in progress), and always on vendors without such a function
    (MariaDB/MySQL, SQLite). Never retried: the work may have committed. Check the database (the ``xid``, or
    your own idempotency key) before doing it again.

    Attributes:
        xid: The PostgreSQL transaction id (``pg_current_xact_id()``) of the transaction, or ``None``.
    """

    def __init__(
        self,
        message: str = "",
        *,
        sqlstate: str | None = None,
        alias: str | None = None,
        attempts: int = 1,
        xid: int | None = None,
    ) -> None:
        """Record the message, code, alias, attempts and transaction id."""
        super().__init__(message, sqlstate=sqlstate, alias=alias, attempts=attempts)
        self.xid = xid


class DatabaseMisconfigured(LockError, OperationalError):
    """The server refused the connection for a reason of the settings: it will refuse it again. Never retried.

    The server answered, and said that the database ``NAME`` names does not exist (SQLSTATE 3D000; MariaDB/MySQL
    1049), that the ``USER`` does not exist or may not log in, or the ``PASSWORD`` is wrong (28000, 28P01; 1045,
    1698), or that the user may not use the database (1044). A server that is down or restarting
    (connection refused, 57P03) is a ``ConnectionLost`` and is waited for; this is not: no entry point retries it,
    whatever the retry policy says, and ``manage.py lockkit_worker`` stops at start with its message. Fix
    ``DATABASES[alias]`` (or create the database or role).

    psycopg reports a refused connection without its SQLSTATE: lockkit recognises the server's message
    (untranslated, ``lc_messages`` in English, as by default); a server that translates it gives no such sign, and
    the failure is then a ``ConnectionLost``, retried as before. ``sqlstate`` is the code the driver gave or the one
    the message stands for.
    """

    failure = Failure.DATABASE_MISCONFIGURED


class ReadOnlyDatabase(LockError, OperationalError):
    """The alias is read-only (a hot standby, a read-only role or transaction) (SQLSTATE 25006).

    An outermost scope or lockkit's own call that gets it discards the connection (outside a caller's transaction),
    so the next call reconnects: after a failover a connection kept open (``CONN_MAX_AGE``, a worker) stays on the
    old writer, now read-only, while a new one reaches the new writer (``target_session_attrs=read-write``, DNS).
    Not retried, except once on a new connection when ``stale`` is true and the retry policy retries lost
    connections (nothing was written: the server refused the first write or lock).

    Attributes:
        stale: The connection had been open before the attempt (a kept connection) and was discarded; a new
            connection may reach a writable server.
    """

    failure = Failure.READ_ONLY
    stale: bool = False


class TransactionAborted(LockError, DatabaseError):
    """The scope's transaction was aborted by a database error its body caught; nothing committed. Never retried.

    On PostgreSQL a failed statement aborts the whole transaction; a body that catches the error (a raw cursor in
    ``try``/``except DatabaseError``, a library that swallows it) and returns normally would otherwise get a COMMIT
    that the server answers with ROLLBACK, and a caller told "done" for writes that are gone. An outermost scope
    checks the driver's transaction status before it commits (no round trip) and raises this instead; on MariaDB/MySQL
    and SQLite it watches its statements for a swallowed InnoDB deadlock (the whole transaction rolled back) or a
    failure that left Django's block marked for rollback. Fix the body:
    let the error propagate, or wrap the statement that may fail in its own ``transaction.atomic()`` (a savepoint),
    as Django documents. See
    https://docs.djangoproject.com/en/stable/topics/db/transactions/#handling-exceptions-within-postgresql-transactions.

    Attributes:
        swallowed: The server's message of the error that aborted the transaction, when the driver kept it.
    """

    def __init__(
        self, message: str = "", *, alias: str | None = None, attempts: int = 1, swallowed: str = ""
    ) -> None:
        """Record the message, alias, attempts and the swallowed error's message."""
        super().__init__(message, alias=alias, attempts=attempts)
        self.swallowed = swallowed


class AliasMismatch(LockError, TransactionManagementError):
    """A queryset bound to one database alias was used in a scope opened on another."""


class NotInLockedScope(LockError, TransactionManagementError):
    """A locking helper was called outside any active ``locked()`` scope."""


class QueryInChange(LockError, TransactionManagementError):
    """``locked_update()``'s ``change`` ran a statement on the database; it must only compute the new values.

    The statement was refused before it was sent, and the call rolled back: nothing was written.
    """


class AdvisoryLockError(LockError):
    """Base class of the errors of an advisory lock that could not keep its promise.

    ``AdvisoryLockAlreadyHeld`` at entry, ``AdvisoryLockLost`` at exit. Never retried.
    """


class AdvisoryLockAlreadyHeld(AdvisoryLockError):
    """A session-level advisory lock was refused at entry: the server session already held the key.

    This block did not take it before (it is not a nested entry of the same block): a pooler in transaction mode
    (PgBouncer ``pool_mode = transaction``) handed this client the server session on which another client holds the
    key, where the lock is re-entrant, so it would have been granted and excluded nobody. Nothing was taken (the
    check and the lock are one statement); the block did not run. Never retried.
    """


class AdvisoryLockLost(AdvisoryLockError):
    """A session-level advisory lock was no longer held by this session when its block ended.

    The connection was closed or replaced during the block (``close_old_connections()``, a lost connection, a
    server restart), or a pooler in transaction mode (PgBouncer ``pool_mode = transaction``) gave the block a
    different server session than the one that took the lock: the block did not run under the lock the whole
    time. Never retried.
    """


class StaleClaim(LockError):
    """A job claim was used after it stopped holding its row; nothing was written. Never retried.

    The row no longer carries the claim's token, or is no longer claimed: ``reclaim_expired`` handed it back
    (and perhaps another worker claimed it), or the claim was already completed or released. The worker must
    stop working on the job: its result would overwrite the new owner's.

    A retried ``complete()`` (its first attempt's reply was lost) also lands here; ``already_done`` tells that
    case apart from a job that was handed to someone else.

    Attributes:
        claims: The stale ``lockkit.claims.Claim`` objects.
        holders: For each stale claim's primary key, who holds the row now: ``(worker, token)`` of the current
            claim, or ``None`` when nobody does.
        already_done: Every stale row still carries its claim's token, is unclaimed, and holds the values this
            call's ``set=`` writes: the claim was already ended with them (typically by an earlier attempt of the
            same ``complete()``/``release()``). Only plain values are compared, not expressions.
    """

    def __init__(
        self,
        message: str = "",
        *,
        alias: str | None = None,
        claims: tuple[Any, ...] = (),
        holders: dict[Any, tuple[str, int] | None] | None = None,
        already_done: bool = False,
    ) -> None:
        """Build the error for the stale ``claims`` on ``alias``."""
        super().__init__(message, alias=alias)
        self.claims = claims
        self.holders = holders or {}
        self.already_done = already_done


class OnCommitError(Exception):
    """An ``on_commit`` callback failed after the transaction committed: the work is committed; do not retry it.

    Deliberately neither a ``LockError`` nor a ``django.db.OperationalError``: a generic "catch the database error
    and retry" must not run committed work again. The callback's exception is ``__cause__``; callbacks registered
    after the failing one did not run (Django stops at the first failure). Register a callback with
    ``robust=True`` to have Django log its failure and carry on instead. See
    https://docs.djangoproject.com/en/stable/topics/db/transactions/#performing-actions-after-commit.

    Attributes:
        result: What the operation returned (``None`` for a ``locked()`` block, which returns nothing).
        alias: The database alias whose transaction committed.
    """

    def __init__(self, message: str = "", *, alias: str | None = None, result: Any = None) -> None:
        """Build the error for the transaction on ``alias`` whose operation returned ``result``."""
        super().__init__(message)
        self.alias = alias
        self.result = result


class UnlockedSaveWarning(UserWarning):
    """A locked scope saved an existing row it had not locked: an unlocked read-modify-write.

    Emitted in ``DEBUG`` and under lockkit's pytest plugin (never otherwise: nothing is recorded then) when
    ``Model.save()`` writes an existing row on the scope's alias that the scope did not lock nor create, and the
    scope has locked rows of that model, or the model is the scope's ``model=`` and the scope has locked nothing at
    all (no row, advisory or table lock): the row was read without ``FOR UPDATE`` (``Stock.objects.get(pk=...)`` instead of
    ``scope.get(Stock, pk=...)``), so a concurrent operation can change it between the read and the write. The
    message names the model label and the primary key. Turn it into an error with
    ``-W error::lockkit.UnlockedSaveWarning`` (or pytest's ``filterwarnings``). See docs/testing.md.
    """


def error_class(failure: Failure) -> type[LockError]:
    """Return the lockkit error class that declares ``failure``.

    Raises:
        KeyError: no class declares ``failure`` (a kind added to the enum without its class).
    """
    return _ERROR_CLASSES[failure]
