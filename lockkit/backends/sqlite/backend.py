"""SQLite: no row locks, so a scope takes the database write lock when it begins (``BEGIN IMMEDIATE``).

https://www.sqlite.org/lang_transaction.html, https://www.sqlite.org/pragma.html#pragma_busy_timeout and
https://docs.djangoproject.com/en/stable/ref/databases/#sqlite-transaction-behavior
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from django.db import NotSupportedError

from lockkit.backends.base import (
    Backend,
    ContentionSQL,
    Features,
    Locks,
    Sessions,
    TimeoutToken,
    Transactions,
)
from lockkit.validation import milliseconds

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.transaction import Atomic

    from lockkit.advisory.keys import AdvisoryKey
    from lockkit.tablemodes import TableLockMode

# Transaction modes that take the write lock at BEGIN.
_WRITE_LOCKING_MODES = frozenset({"IMMEDIATE", "EXCLUSIVE"})

# The outermost atomic blocks a scope began with BEGIN IMMEDIATE: their transaction holds the database write lock.
_WRITE_LOCKED: weakref.WeakSet[Atomic] = weakref.WeakSet()


class SQLiteFeatures(Features):
    """``RETURNING`` from SQLite 3.35, the busy timeout of ``BEGIN IMMEDIATE``, whose write lock covers every key."""

    claims_name = "SQLite 3.35+"
    transaction_locks_database = True

    def claims_supported(self, connection: BaseDatabaseWrapper) -> bool:
        """``RETURNING`` (SQLite 3.35, with its ``INSERT ... RETURNING``)."""
        return bool(connection.features.can_return_columns_from_insert)

    def timeout_support(self, connection: BaseDatabaseWrapper) -> tuple[str | None, str | None]:
        """Say how timeouts apply here: the busy timeout of ``BEGIN IMMEDIATE``; no statement timeout."""
        return "busy timeout of BEGIN IMMEDIATE (the database write lock), whole milliseconds", None

    def advisory_support(self, connection: BaseDatabaseWrapper) -> str | None:
        """Describe how SQLite scopes cover advisory locks, for ``lockkit_capabilities``."""
        return (
            "inside a scope only: the scope's BEGIN IMMEDIATE write lock already excludes every other scope, "
            "so it covers every key (no session=True)"
        )

    def table_lock_support(self, connection: BaseDatabaseWrapper) -> str | None:
        """Describe how SQLite scopes cover ``lock_table``, for ``lockkit_capabilities``."""
        return (
            "inside a scope only, every mode but ACCESS EXCLUSIVE: the scope's BEGIN IMMEDIATE write lock already "
            "excludes every other writer (readers go on, as under EXCLUSIVE)"
        )


class SQLiteTransactions(Transactions):
    """``BEGIN IMMEDIATE`` for the outermost scope, with the lock timeout as the busy timeout of that BEGIN.

    ``SELECT ... FOR UPDATE`` does not exist on SQLite (Django silently drops ``select_for_update()``), and a
    deferred transaction that reads then writes can fail at once with ``SQLITE_BUSY``, whatever the busy
    timeout.
    Taking the write lock at the start serialises every locked scope on the database: the read-decide-write is
    correct, waits obey the lock timeout, and "database is locked" is a ``LockTimeout`` that
    ``locked_operation`` retries. Once ``BEGIN IMMEDIATE`` succeeded no other lock is waited for except by
    ``COMMIT`` (rollback-journal mode, waiting for readers), which uses the connection's ``timeout`` option.
    A nested scope runs in a savepoint of a transaction that already began: it cannot change how that began.
    """

    def open_transaction(
        self,
        connection: BaseDatabaseWrapper,
        atomic: Atomic,
        *,
        lock_timeout: float | None,
        statement_timeout: float | None,
        nested: bool,
    ) -> None:
        """Begin with ``BEGIN IMMEDIATE`` under the scope's busy timeout, so the write lock is waited for here.

        Raises:
            NotSupportedError: the scope asked for a ``statement_timeout``, which SQLite cannot apply.
        """
        if statement_timeout is not None:
            raise NotSupportedError(
                f"statement_timeout is not supported on sqlite ({connection.alias!r}); "
                "pass statement_timeout=None"
            )
        if nested:
            atomic.__enter__()
            return
        connection.ensure_connection()
        wrapper: Any = connection  # transaction_mode is an attribute of Django's SQLite wrapper only
        mode = wrapper.transaction_mode
        previous_busy = _busy_timeout(connection) if lock_timeout is not None else None
        try:
            if lock_timeout is not None:
                _set_busy_timeout(connection, milliseconds(lock_timeout))
            if mode not in _WRITE_LOCKING_MODES:
                wrapper.transaction_mode = "IMMEDIATE"
            atomic.__enter__()
            _WRITE_LOCKED.add(atomic)
        finally:
            # Both are per-connection: put them back at once so nothing outlives this BEGIN.
            wrapper.transaction_mode = mode
            if previous_busy is not None and connection.connection is not None:
                _set_busy_timeout(connection, previous_busy)


class SQLiteLocks(Locks):
    """The database write lock of ``BEGIN IMMEDIATE`` covers every advisory key and every table; the busy timeout."""

    def check_advisory(self, connection: BaseDatabaseWrapper, *, shared: bool, session: bool) -> None:
        """Refuse ``session=True``: SQLite has no session-level locks."""
        if session:
            raise NotSupportedError(
                f"session=True advisory locks are not supported on sqlite ({connection.alias!r}): SQLite has no "
                "session-level locks; use a scope (session=False), whose write lock serialises every scope"
            )

    def acquire_advisory(
        self,
        connection: BaseDatabaseWrapper,
        key: AdvisoryKey,
        *,
        shared: bool,
        session: bool,
        nowait: bool,
        timeout: float | None,
        unless_held: bool = False,
    ) -> tuple[bool | None, int | None]:
        """Check that the transaction holds the database write lock, which covers every key.

        ``unless_held`` changes nothing: session-level locks, the only ones that ask, are refused here.
        """
        self.check_advisory(connection, shared=shared, session=session)
        if not _write_locked(connection):
            # A deferred transaction may hold no lock at all yet: a key "held" here would exclude nobody.
            raise NotSupportedError(
                f"an advisory lock on sqlite ({connection.alias!r}) needs the database write lock, which this "
                "transaction does not hold: open the scope outside any plain atomic() block, or set "
                "OPTIONS['transaction_mode'] = 'IMMEDIATE'"
            )
        return True, None

    def release_advisory(
        self, connection: BaseDatabaseWrapper, key: AdvisoryKey, *, shared: bool
    ) -> tuple[bool, int | None]:
        """Nothing to release: the write lock ends with the transaction."""
        return True, None  # the write lock ends with the transaction

    def check_table_lock(self, connection: BaseDatabaseWrapper, mode: TableLockMode) -> None:
        """Refuse ``ACCESS EXCLUSIVE`` (SQLite cannot keep readers out), and a transaction without the write lock."""
        if mode.value == "ACCESS EXCLUSIVE":
            raise NotSupportedError(
                f"lock_table(mode=ACCESS EXCLUSIVE) is not supported on sqlite ({connection.alias!r}): the "
                "scope's write lock keeps every other writer out but not readers (WAL mode never blocks them), "
                "and ACCESS EXCLUSIVE promises that no one reads; EXCLUSIVE (no writer, readers go on) is what "
                "the write lock gives"
            )
        if not _write_locked(connection):
            raise NotSupportedError(
                f"a table lock on sqlite ({connection.alias!r}) needs the database write lock, which this "
                "transaction does not hold: open the scope outside any plain atomic() block, or set "
                "OPTIONS['transaction_mode'] = 'IMMEDIATE'"
            )

    def lock_tables(
        self, connection: BaseDatabaseWrapper, tables: list[str], mode: TableLockMode, *, nowait: bool
    ) -> None:
        """Nothing to send: the transaction's database write lock covers the tables (``check_table_lock``)."""
        self.check_table_lock(connection, mode)

    def bound_lock_waits(
        self, connection: BaseDatabaseWrapper, lock_timeout: float, *, in_transaction: bool
    ) -> TimeoutToken:
        """Set the connection's busy timeout (how long SQLite waits for the database lock)."""
        # The busy timeout is how long SQLite waits for the database lock; per connection, restored by the caller.
        previous = _busy_timeout(connection)
        _set_busy_timeout(connection, milliseconds(lock_timeout))
        return TimeoutToken({"busy_timeout": previous})

    def unbound_lock_waits(self, connection: BaseDatabaseWrapper, token: TimeoutToken) -> None:
        """Put the busy timeout back (closing the connection if that fails)."""
        try:
            _set_busy_timeout(connection, int(token.previous["busy_timeout"]))
        except BaseException:
            if not connection.in_atomic_block:
                connection.close()
            raise


class SQLiteSessions(Sessions):
    """SQLite has no server sessions: nothing to inspect or signal."""

    def contention_sql(self, connection: BaseDatabaseWrapper) -> ContentionSQL:
        """SQLite has no sessions to observe: refused with the reason and what to do instead.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(
            f"the contention toolkit (hold_lock, wait_until_blocked, blocked_by, backend_pid) does not support "
            f"SQLite ({connection.alias!r}): SQLite has no row locks and no server sessions to observe (a lockkit "
            "scope there takes the whole database's write lock at BEGIN IMMEDIATE). Test contention on PostgreSQL "
            "or MariaDB/MySQL; on SQLite two scopes simply run one after the other, and a wait longer than "
            "lock_timeout raises LockTimeout"
        )


class SQLiteBackend(Backend):
    """SQLite's parts (Django's ``sqlite3`` backend)."""

    features_class = SQLiteFeatures
    transactions_class = SQLiteTransactions
    locks_class = SQLiteLocks
    sessions_class = SQLiteSessions


def _write_locked(connection: BaseDatabaseWrapper) -> bool:
    """Whether the connection's transaction holds the database write lock (it began with BEGIN IMMEDIATE)."""
    wrapper: Any = connection  # transaction_mode is an attribute of Django's SQLite wrapper only
    blocks = connection.atomic_blocks
    outermost = blocks[0] if blocks else None
    return outermost is not None and (
        outermost in _WRITE_LOCKED or str(wrapper.transaction_mode or "").upper() in _WRITE_LOCKING_MODES
    )


def _busy_timeout(connection: BaseDatabaseWrapper) -> int:
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def _set_busy_timeout(connection: BaseDatabaseWrapper, value: int) -> None:
    # PRAGMA takes no bound parameters; the value is an int lockkit computed, never text from outside.
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {int(value)}")
