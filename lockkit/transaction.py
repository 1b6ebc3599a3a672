"""The lifecycle of one scope's transaction or savepoint, as a context manager (private to lockkit).

``ScopeTransaction`` begins the transaction (or savepoint) through the vendor backend, applies the scope's timeouts,
marks the commit, restores what the backend changed, and turns database failures into lockkit's typed errors. It
knows nothing of the stack of active scopes or of retries. See
https://docs.djangoproject.com/en/stable/topics/db/transactions/#controlling-transactions-explicitly.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from django.db import connections, transaction

from lockkit.backends import TimeoutToken, backend_for
from lockkit.translate import translating


def in_transaction(connection: Any) -> bool:
    """Whether the connection is inside a transaction someone else began (``atomic`` or autocommit turned off)."""
    return bool(connection.in_atomic_block or not connection.get_autocommit())


class ScopeTransaction:
    """Begin, time-limit and end one scope's transaction (a savepoint when ``nested``) on one alias.

    Attributes:
        alias: The database alias.
        nested: The transaction began inside an existing one on the alias (it is a savepoint).
        committed: The scope's own transaction has committed (set by its first ``on_commit`` hook); an error
            raised after that comes from a later callback, not from the commit.
    """

    def __init__(
        self,
        alias: str,
        *,
        lock_timeout: float | None,
        statement_timeout: float | None,
        nowait: bool,
        attempt: int,
    ) -> None:
        """Prepare the transaction (no SQL yet); ``nested`` is decided now, from the connection."""
        connection = connections[alias]
        self.alias = alias
        self.nested = in_transaction(connection)
        self.committed = False
        self.backend = backend_for(connection)
        self._lock_timeout = lock_timeout
        self._statement_timeout = statement_timeout
        self._atomic = transaction.atomic(using=alias)
        self._translating = translating(alias, nowait=nowait, attempts=attempt)
        self._token: TimeoutToken | None = None

    def __enter__(self) -> ScopeTransaction:
        """Begin the transaction or savepoint and apply the timeouts.

        Raises:
            LockError: the database reported a classified failure (SQLite's BEGIN IMMEDIATE may wait for a lock).
        """
        connection = connections[self.alias]
        with self._translating:
            self.backend.open_transaction(
                connection,
                self._atomic,
                lock_timeout=self._lock_timeout,
                statement_timeout=self._statement_timeout,
                nested=self.nested,
            )
        try:
            self._token = self.backend.apply_timeouts(
                connection,
                lock_timeout=self._lock_timeout,
                statement_timeout=self._statement_timeout,
                nested=self.nested,
            )
        except BaseException as exc:
            self._atomic.__exit__(type(exc), exc, exc.__traceback__)
            self._raise_translated(exc)
            raise
        if not self.nested:
            # Registered first in a transaction this scope began, so it runs first after the COMMIT: if
            # atomic's exit then raises, the error is a later callback's, and the transaction is committed.
            transaction.on_commit(self._mark_committed, using=self.alias)
        return self

    def _mark_committed(self) -> None:
        self.committed = True

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """End the transaction: commit or release on success, roll back on error; raise typed errors.

        Raises:
            LockError: the block's database failure, or the commit's, as its typed error.
            DatabaseError: a nested scope could not restore its timeouts (the block swallowed a database error).
        """
        connection = connections[self.alias]
        restore_error: BaseException | None = None
        # After an error swallowed inside the block the savepoint is rolled back anyway, which reverts the timeouts.
        if exc is None and self.nested and self._token is not None and not connection.needs_rollback:
            try:
                self.backend.restore_before_release(connection, self._token)
            except BaseException as restore_exc:
                # Typically 25P02: the body swallowed a database error, so the savepoint cannot be released.
                # Roll it back and raise, as Django's own nested atomic() does; never lose the writes silently.
                exc = restore_error = restore_exc
        try:
            self._atomic.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        except BaseException as commit_exc:
            self._after_end(pending=True)
            if self.committed:
                raise  # an on_commit callback failed after the COMMIT: not a failure of the transaction
            self._raise_translated(commit_exc)
            raise
        self._after_end(pending=exc is not None)
        if exc is not None:
            self._raise_translated(exc)
            if restore_error is not None:
                raise restore_error

    def _raise_translated(self, exc: BaseException) -> None:
        """Raise the typed error for ``exc`` from ``exc``; return for anything else (a ``LockError`` gets the alias)."""
        self._translating.__exit__(type(exc), exc, exc.__traceback__)

    def _after_end(self, *, pending: bool) -> None:
        """Let the backend restore session settings a rollback does not revert (MySQL), after success or error.

        A failure to restore is raised when nothing else is; otherwise the scope's own error wins (the backend has
        already made sure the altered value cannot outlive the failure).
        """
        if self._token is None:
            return
        try:
            self.backend.after_transaction_end(connections[self.alias], self._token, nested=self.nested)
        except BaseException:
            if not pending:
                raise
