"""The lifecycle of one scope's transaction or savepoint, as a context manager (private to lockkit).

``ScopeTransaction`` begins the transaction (or savepoint) through the vendor backend, applies the scope's timeouts,
marks the commit, restores what the backend changed, and turns database failures into lockkit's typed errors. It
knows nothing of the stack of active scopes or of retries. See
https://docs.djangoproject.com/en/stable/topics/db/transactions/#controlling-transactions-explicitly.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from django.db import Error, connections, transaction
from django.db.transaction import TransactionManagementError

from lockkit import cancellation
from lockkit._engine import failures, forks, outcome
from lockkit._engine.callbacks import Callbacks
from lockkit._engine.liveness import discard_after_loss, discard_if_dead, discard_read_only
from lockkit.backends import TimeoutToken, backend_for
from lockkit.errorcodes.table import code_of
from lockkit.errorcodes.translate import translate, translating
from lockkit.errors import ConnectionLost, LockError, OnCommitError, ReadOnlyDatabase, TransactionAborted
from lockkit.retries import from_settings, reconnect_budget

logger = logging.getLogger("lockkit")

# Seconds lockkit spends finding out whether a COMMIT whose reply was lost committed (reconnecting through a
# restart included) before it gives up and raises CommitOutcomeUnknown, when the scope is not given its own budget:
# the default RetryPolicy's reconnect_within. A locked_operation resolves for its policy's reconnect_within.
COMMIT_RESOLUTION_TIMEOUT = 5.0


def in_transaction(connection: Any) -> bool:
    """Whether the connection is inside a transaction someone else began (``atomic`` or autocommit turned off).

    A closed connection (never opened, or discarded after it died) holds no transaction: nothing is connected
    here, so a server that is down shows up when the scope begins, as a ``ConnectionLost`` it can retry.
    """
    if connection.connection is None:
        return bool(connection.in_atomic_block)
    return bool(connection.in_atomic_block or not connection.get_autocommit())


class ScopeTransaction:
    """Begin, time-limit and end one scope's transaction (a savepoint when ``nested``) on one alias.

    Attributes:
        alias: The database alias.
        nested: The transaction began inside an existing one on the alias (it is a savepoint).
        committed: The scope's own transaction has committed (set by its first ``on_commit`` hook); an error
            raised after that comes from a later callback, not from the commit, and is raised as
            ``OnCommitError``.
        xid: The PostgreSQL transaction id of an outermost scope (read by its opening statement), else ``None``.
        doomed: The first database error lockkit's helpers raised in the block: the block is marked for
            rollback, and the scope ends with this error even when the body caught it.
        translating: The translator of the block's database errors (``lockkit.errorcodes.translate.translating``).
    """

    def __init__(
        self,
        alias: str,
        *,
        lock_timeout: float | None,
        statement_timeout: float | None,
        nowait: bool,
        attempt: int,
        resolve_within: float | None = None,
    ) -> None:
        """Prepare the transaction; ``nested`` is decided now, from the connection.

        No SQL, but a ping of a connection left with autocommit off on which Django recorded an error.
        """
        # Django's wrapper for the alias in this thread: the same object for the thread's life (the driver
        # connection inside it is what changes when Django reconnects).
        self._connection = connection = connections[alias]
        self.alias = alias
        if not connection.in_atomic_block and not connection.autocommit:
            # A dead connection whose autocommit an atomic() exit could not turn back on is no transaction of the
            # caller's: discarded here, the scope is outermost on a new connection (``discard_if_dead``).
            discard_if_dead(alias)
        self.nested = in_transaction(connection)
        self.committed = False
        self.doomed: BaseException | None = None
        self.backend = backend_for(connection)
        self._lock_timeout = lock_timeout
        self._statement_timeout = statement_timeout
        # A plain locked() scope: the project's LOCKKIT["RETRY"] reconnect_within, as every entry point.
        self._resolve_within = reconnect_budget(from_settings()) if resolve_within is None else resolve_within
        self._atomic = transaction.atomic(using=alias)
        self.translating = translating(
            alias, nowait=nowait, attempts=attempt, timed=statement_timeout is not None
        )
        self._token: TimeoutToken | None = None
        self._cancellation: cancellation.Cancellation | None = None  # an awaiting caller's (outermost only)
        self._server: Any = None
        self._raw: Any = None  # the driver connection the transaction runs on
        self._reused = False  # the connection was open before this scope began (a kept connection)
        # Session settings put back by the first on_commit hook (before the user's callbacks), and its failure.
        self._restored = False
        self._restore_error: BaseException | None = None
        # The on_commit callbacks registered through lockkit in this transaction: lockkit's own record, run by
        # the engine when a lost COMMIT turns out to have committed (Django forgets its list then).
        self.callbacks = Callbacks()
        # The block's failed statements, where the driver keeps no aborted state to read (outermost only).
        self._failures: failures.FailedStatements | None = None
        self._watching = contextlib.ExitStack()

    def __enter__(self) -> ScopeTransaction:
        """Begin the transaction or savepoint and apply the timeouts.

        Raises:
            LockError: the database reported a classified failure (SQLite's BEGIN IMMEDIATE may wait for a lock).
        """
        connection = self._connection
        waiting = None if self.nested else cancellation.current()
        if waiting is not None:
            waiting.raise_if_cancelled()  # the caller is gone: no new attempt
        forks.install()  # a forked child never shares its parent's sessions (also installed by the app's ready())
        if not self.nested:
            # Django saw this connection fail, or the server ended it while idle: reconnect rather than fail.
            discard_if_dead(self.alias)
        self._reused = connection.connection is not None
        with self._lost_connection_discarded(), self.translating:
            self.backend.tx.open_transaction(
                connection,
                self._atomic,
                lock_timeout=self._lock_timeout,
                statement_timeout=self._statement_timeout,
                nested=self.nested,
            )
        self._raw = connection.connection
        self._cancellation = waiting
        if waiting is not None:
            session = self.backend.sessions.local_session_id(connection)
            if session is not None:
                waiting.attach(functools.partial(self.backend.sessions.cancel_statement, self.alias, session))
        try:
            self._token = self.backend.tx.apply_timeouts(
                connection,
                lock_timeout=self._lock_timeout,
                statement_timeout=self._statement_timeout,
                nested=self.nested,
            )
        except BaseException as exc:
            with self._lost_connection_discarded():
                try:
                    self._atomic.__exit__(type(exc), exc, exc.__traceback__)
                except BaseException as rollback_exc:
                    # Django reconnects when it restores autocommit; during a restart that fails too.
                    self._raise_translated(rollback_exc)
                    raise
                self._raise_translated(exc)
            raise
        # The server the transaction runs on (PostgreSQL: system identifier and timeline), for a lost COMMIT.
        self._server = None if self.nested else self.backend.tx.transaction_server(connection)
        if not self.nested:
            # Registered first in a transaction this scope began, so it runs first after the COMMIT: if
            # atomic's exit then raises, the error is a later callback's, and the transaction is committed.
            transaction.on_commit(self._mark_committed, using=self.alias)
            # lockkit's record of its callbacks follows the transaction's savepoints (inner atomic() blocks).
            self._watching.enter_context(self.callbacks.watch(connection))
            if self.backend.features.watches_failed_statements:
                self._failures = failures.FailedStatements()
                self._watching.enter_context(connection.execute_wrapper(self._failures))
        return self

    @property
    def opened(self) -> tuple[str | None, ...]:
        """The values of the backend's opening columns, read by the statement that opened an outermost scope."""
        return self._token.opened if self._token is not None else ()

    @property
    def xid(self) -> int | None:
        """The PostgreSQL transaction id of an outermost scope, once its opening statement ran; else ``None``."""
        return None if self.nested else self.backend.tx.transaction_id(self._token)

    def _mark_committed(self) -> None:
        self.committed = True
        if self._token is not None:
            # Before the user's callbacks, which run after this hook: they see the connection's own session
            # settings (MySQL), as they do on PostgreSQL where the scope's values ended with the transaction.
            self._restored = True
            try:
                self.backend.tx.after_transaction_end(self._connection, self._token, nested=False)
            except Exception as exc:  # raised after the callbacks, by _after_end: they must still run
                self._restore_error = exc

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """End the transaction (``_end``); a call whose awaiting caller was cancelled ends with ``CallCancelled``.

        Raises:
            lockkit.cancellation.CallCancelled: the awaiting caller was cancelled before the COMMIT was sent; the
                scope rolled back (raised from the statement's error when the server-side cancel interrupted it).
        """
        interrupt = failures.interrupt_behind(self._connection, exc)
        if exc is not None and (interrupt is not None or not isinstance(exc, Error | LockError)):
            self._interrupted()
        try:
            self._end(exc)
        except BaseException as error:
            self._raise_if_abandoned(error)
            raise
        if exc is not None:
            self._raise_if_abandoned(exc)
        if interrupt is not None:
            raise interrupt  # the interrupt itself, not the driver's complaint about the statement it cut short

    def _interrupted(self) -> None:
        """An exception that is not the database's left the block: cancel the statement it left running.

        The connection is dropped too (its driver is mid-reply), so the server neither goes on waiting nor then
        holds what it waited for; inside a caller's ``atomic()`` that block then fails, as it must.
        """
        if self.backend.tx.cancel_in_flight(self._connection):
            logger.warning(
                "lockkit: an exception interrupted a statement on %r; it was cancelled on the server and the "
                "connection is discarded",
                self.alias,
            )
            with contextlib.suppress(Error):
                self._connection.close()

    def _raise_if_abandoned(self, error: BaseException) -> None:
        """Raise ``CallCancelled`` from ``error`` when the scope failed because its awaiting caller was cancelled."""
        waiting = self._cancellation
        if (
            waiting is not None
            and waiting.cancelled
            and not waiting.committing
            and not isinstance(error, cancellation.CallCancelled)
        ):
            raise cancellation.CallCancelled(
                f"the awaiting caller was cancelled; {self.alias!r} rolled back"
            ) from error

    def _end(self, exc: BaseException | None) -> None:
        """End the transaction: commit or release on success, roll back on error; raise typed errors.

        A connection lost while COMMIT was in flight is resolved: committed (the callbacks run, nothing is
        raised), rolled back (``ConnectionLost``), or unknown (``CommitOutcomeUnknown``).

        Raises:
            LockError: the block's database failure, or the commit's, as its typed error; the error a helper
                raised in the block when the body swallowed it.
            DatabaseError: a nested scope could not restore its timeouts (the block swallowed a database error).
        """
        self._watching.close()  # Django's execute_wrapper() stack: the body's statements have all run
        connection = self._connection
        restore_error: BaseException | None = None
        doomed = self.doomed if exc is None or isinstance(exc, TransactionManagementError) else None
        waiting = self._cancellation
        if waiting is not None:
            if doomed is None and exc is None and not waiting.begin_commit(self._resolve_within):
                # The awaiting caller was cancelled before COMMIT: roll back (lockkit.cancellation).
                doomed = cancellation.CallCancelled(
                    f"the awaiting caller was cancelled; {self.alias!r} rolled back"
                )
            if waiting.cancelled:
                waiting.settle()  # the server-side cancel is sent before the session runs anything else
            waiting.attach(None)
        if doomed is None and exc is None and connection.closed_in_transaction:
            doomed = self._closed_inside()  # Django ends the block quietly: its writes are gone all the same
        if doomed is None and exc is None and not self.nested:
            # Also when Django marked the block for rollback (an ORM write's own atomic(savepoint=False) failed):
            # the driver says "aborted by an error", which a deliberate set_rollback(True) never does.
            doomed = self._swallowed_error()
        if doomed is not None:
            exc = None  # the body swallowed a helper's error: roll back, then raise that error
            transaction.set_rollback(True, using=self.alias)  # Django's public form of needs_rollback
        # After an error swallowed inside the block the savepoint is rolled back anyway, which reverts the timeouts.
        if exc is None and self.nested and self._token is not None and not connection.needs_rollback:
            try:
                self.backend.tx.restore_before_release(connection, self._token)
            except BaseException as restore_exc:
                # Typically 25P02: the body swallowed a database error, so the savepoint cannot be released.
                # Roll it back and raise, as Django's own nested atomic() does; never lose the writes silently.
                exc = restore_error = restore_exc
        committing = exc is None and not self.nested and not connection.needs_rollback
        try:
            self._atomic.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        except BaseException as commit_exc:
            self._after_end(pending=True)
            if self.committed:
                if isinstance(commit_exc, Exception):
                    # An on_commit callback failed after the COMMIT: not a failure of the transaction.
                    raise self._on_commit_error(commit_exc) from commit_exc
                raise
            if committing and self.backend.tx.cancel_in_flight(connection):
                # Not the database's error: an exception (a signal handler's time limit) left the wait for the
                # COMMIT's reply, and the server may still commit.
                outcome.after_interrupt(
                    self.alias,
                    commit_exc,
                    self.xid,
                    self._server,
                    self.callbacks,
                    within=self._resolve_within,
                )
            if committing and code_of(commit_exc) == outcome.AMBIGUOUS_COMMIT:
                raise outcome.ambiguous(self.alias, commit_exc, self.xid) from commit_exc
            error = self._translate(commit_exc)
            if committing and isinstance(error, ConnectionLost):
                self._resolve_commit(error)
                return
            with self._lost_connection_discarded():
                if error is not None:
                    raise error from commit_exc
                raise
        self._after_end(pending=exc is not None or doomed is not None)
        if doomed is not None:
            self._discard_after(doomed)
            raise doomed
        error = None if exc is None else self._translate(exc)
        self._discard_after(error)
        if error is not None and error is not exc:
            raise error from exc
        if restore_error is not None:
            raise restore_error

    def _discard_after(self, error: BaseException | None) -> None:
        """Discard the connection after a ``ConnectionLost`` or, outermost, a ``ReadOnlyDatabase`` (a failover)."""
        if isinstance(error, ConnectionLost):
            discard_after_loss(self.alias)
        elif isinstance(error, ReadOnlyDatabase) and not self.nested:
            discard_read_only(self.alias, error, reused=self._reused)

    def _swallowed_error(self) -> TransactionAborted | None:
        """A ``TransactionAborted`` when the body returned normally from an aborted transaction, else ``None``."""
        swallowed = self.backend.tx.aborted_by(self._connection)
        if swallowed is None and self._failures is not None:
            failed = self._failures.swallowed()
            swallowed = None if failed is None else str(failed)
        if swallowed is None:
            return None
        said = f": {swallowed}" if swallowed else ""
        return TransactionAborted(
            f"the transaction on {self.alias!r} was aborted by a database error the scope's body caught{said}; "
            "nothing was committed. Let the error propagate, or run the statement that may fail in its own "
            "transaction.atomic() block (a savepoint)",
            alias=self.alias,
            attempts=self.translating.attempts,
            swallowed=swallowed,
        )

    def _closed_inside(self) -> TransactionAborted:
        """The body closed the connection (``close()``, ``close_old_connections()``): its transaction is gone."""
        return TransactionAborted(
            f"the connection of {self.alias!r} was closed inside the scope (connection.close() or "
            "close_old_connections(), say), and its transaction rolled back with it: nothing was committed. Close "
            "connections outside locked blocks",
            alias=self.alias,
            attempts=self.translating.attempts,
        )

    def _on_commit_error(self, callback_error: Exception) -> OnCommitError:
        return outcome.on_commit_error(self.alias, callback_error)

    def doom(self, error: BaseException) -> None:
        """Mark the block for rollback because a lockkit helper raised ``error`` in it (kept: the first one)."""
        transaction.set_rollback(True, using=self.alias)
        if self.doomed is None:
            self.doomed = error

    def _translate(self, exc: BaseException) -> LockError | None:
        if isinstance(exc, LockError):
            if exc.alias is None:
                exc.alias = self.alias
            return exc
        t = self.translating
        return translate(
            exc, alias=self.alias, nowait=t.nowait, attempts=t.attempts, timed=t.timed, raw=self._raw
        )

    def _resolve_commit(self, lost: ConnectionLost) -> None:
        """The connection died while COMMIT was in flight: ask the server what became of the transaction."""
        outcome.of_transaction(self.alias, self.xid, self._server, lost, within=self._resolve_within)
        self.callbacks.run_pending(self._on_commit_error)  # committed: those Django forgot run now, once

    @contextlib.contextmanager
    def _lost_connection_discarded(self) -> Iterator[None]:
        """Discard the alias's connection when a ``ConnectionLost`` leaves the block (outside transactions)."""
        try:
            yield
        except ConnectionLost:
            discard_after_loss(self.alias)
            raise

    def _raise_translated(self, exc: BaseException) -> None:
        """Raise the typed error for ``exc`` from ``exc``; return for anything else (a ``LockError`` gets the alias)."""
        error = self._translate(exc)
        if error is not None and error is not exc:
            raise error from exc

    def _after_end(self, *, pending: bool) -> None:
        """Let the backend restore session settings a rollback does not revert (MySQL), after success or error.

        A failure to restore is raised when nothing else is; otherwise the scope's own error wins (the backend has
        already made sure the altered value cannot outlive the failure).
        """
        if self._token is None:
            return
        if self._restored:
            if self._restore_error is not None and not pending:
                raise self._restore_error
            return
        try:
            self.backend.tx.after_transaction_end(self._connection, self._token, nested=self.nested)
        except BaseException:
            if not pending:
                raise
