"""The one translator from database errors to lockkit's typed errors, shaped like Django's ``DatabaseErrorWrapper``.

Scopes, claims and the testing toolkit all run their SQL inside ``with translating(alias, nowait=...):``; a
``django.db.DatabaseError`` whose code lockkit knows leaves the block as the typed error (``LockTimeout``...),
raised ``from`` the original. See https://docs.djangoproject.com/en/stable/ref/exceptions/#database-exceptions.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from django.db import Error, InterfaceError, OperationalError, connections

from lockkit.errorcodes.table import classify, code_of, lookup, row_for
from lockkit.errors import Failure, LockError, error_class


def connection_gone(alias: str, raw: Any = None) -> bool:
    """Whether the alias's connection (or ``raw``, the driver connection some work ran on) is closed or broken.

    Read from local state, no round trip: Django dropped or replaced the driver connection (an ``atomic()`` whose
    rollback failed closes it, and reopens one when it restores autocommit), or the driver says so itself
    (psycopg 3 ``closed``/``broken``, psycopg2 ``closed``). mysqlclient keeps no such state; its lost connections
    carry codes (2006, 2013...).
    """
    current = connections[alias].connection
    if current is None or (raw is not None and current is not raw):
        return True
    driver = raw if raw is not None else current
    return bool(getattr(driver, "closed", False) or getattr(driver, "broken", False))


def translate(
    exc: BaseException,
    *,
    alias: str,
    nowait: bool,
    attempts: int = 1,
    timed: bool = False,
    raw: Any = None,
) -> LockError | None:
    """Build the typed lockkit error a database failure stands for, or return ``None`` for anything else.

    A failure whose code lockkit does not know (or that has none, as psycopg's own "consuming input failed") is a
    ``ConnectionLost`` when the driver's connection is closed or broken afterwards.

    Args:
        exc: The exception raised by the database work.
        alias: The database alias the work ran on.
        nowait: Whether the failing statement used ``NOWAIT`` (tells the two meanings of 55P03 apart).
        attempts: How many attempts the operation had made (1 when not retried).
        timed: Whether lockkit set a statement timeout for the work (tells the two meanings of 57014 apart).
        raw: The driver connection the work ran on, when known (Django may have replaced it since).

    Returns:
        A new ``LockError`` subclass instance whose ``__cause__`` is ``exc``, or ``None`` when ``exc`` is not a
        Django database ``Error`` lockkit classifies (lockkit errors included: they are already typed).
    """
    if isinstance(exc, LockError) or not isinstance(exc, Error):
        return None
    failure = classify(exc, nowait=nowait, timed=timed)
    # Drivers report a lost connection as an OperationalError or an InterfaceError (Django keeps the class).
    if failure is None and isinstance(exc, OperationalError | InterfaceError) and connection_gone(alias, raw):
        failure = Failure.CONNECTION_LOST
    if failure is None:
        return None
    row = lookup(exc)
    if row is None and failure is Failure.IDLE_IN_TRANSACTION_TIMEOUT:
        row = row_for("postgresql", "25P03")  # recognised by its message (a driver that gave no code)
    hint = f" ({row.hint})" if row is not None and row.hint else ""
    sqlstate = code_of(exc)
    if sqlstate is None and row is not None and failure is Failure.DATABASE_MISCONFIGURED:
        # Recognised by the server's message: psycopg gives no code for a failed connection.
        sqlstate = row.code
    error = error_class(failure)(
        f"{failure.value} on database {alias!r}: {exc}".strip() + hint,
        sqlstate=sqlstate,
        alias=alias,
        attempts=attempts,
    )
    error.__cause__ = exc
    return error


class translating:  # a context manager named like a function, as Django's atomic
    """Context manager that raises the typed lockkit error for a classified database failure in its block.

    A ``LockError`` without an alias gets this one; any other exception passes through unchanged.

    Args:
        alias: The database alias the block runs on.
        nowait: Whether the block's locking statements use ``NOWAIT``.
        attempts: The attempt number the block runs as.
        timed: Whether lockkit set a statement timeout for the block.
    """

    def __init__(self, alias: str, *, nowait: bool, attempts: int = 1, timed: bool = False) -> None:
        """Hold what the typed errors will carry."""
        self.alias = alias
        self.nowait = nowait
        self.attempts = attempts
        self.timed = timed

    def __enter__(self) -> None:
        """Enter the block; nothing to set up."""

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Raise the typed error for ``exc`` from ``exc``, or let ``exc`` propagate unchanged."""
        if exc is None:
            return
        if isinstance(exc, LockError):
            if exc.alias is None:
                exc.alias = self.alias
            return
        error = translate(exc, alias=self.alias, nowait=self.nowait, attempts=self.attempts, timed=self.timed)
        if error is not None:
            raise error from exc
