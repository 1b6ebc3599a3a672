"""PostgreSQL's parts: transaction-scoped ``lock_timeout``/``statement_timeout`` (``set_config(name, value, true)``).

https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADMIN-SET and
https://www.postgresql.org/docs/current/runtime-config-client.html#GUC-LOCK-TIMEOUT
"""

from __future__ import annotations

import contextlib
import time
import weakref
from typing import TYPE_CHECKING, Any

from django.db import Error, NotSupportedError

from lockkit.backends.base import (
    Backend,
    ContentionSQL,
    Features,
    Locks,
    Sessions,
    TimeoutToken,
    Transactions,
)
from lockkit.backends.postgresql import locks as postgresql_locks
from lockkit.backends.postgresql import opening
from lockkit.validation import milliseconds

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from lockkit.advisory.keys import AdvisoryKey
    from lockkit.backends.waits import LockWait, Session, SessionTarget
    from lockkit.tablemodes import TableLockMode

# The setting names are constants of ours, never user input. Values travel as parameters, except in the one-message
# opening (``opening``): there an int of milliseconds lockkit computed from a validated duration, written with %d.
_NAMES = ("lock_timeout", "statement_timeout")

# The server a connection reached, as (system identifier, timeline): read by the first outermost scope's opening on
# each driver connection (no extra round trip), and checked again before a lost COMMIT is resolved. A promoted
# standby has its primary's system identifier but a new timeline, and hands out the old primary's unreplicated
# transaction ids again; pg_xact_status there says nothing about the lost transaction. The timeline is the current
# WAL file's (pg_control_checkpoint lags behind a promotion until its checkpoint); NULL on a server in recovery.
_SERVER_COLUMNS = (
    "(SELECT system_identifier::text FROM pg_control_system())",
    "CASE WHEN pg_is_in_recovery() THEN NULL ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END",
)
Server = tuple[str | None, str | None]


def distributed_sql(connection: BaseDatabaseWrapper) -> str | None:
    """Which distributed SQL database speaks PostgreSQL's protocol on this open connection, or ``None``.

    Read locally from what the server announced when the connection started (libpq's ``ParameterStatus``, through
    the driver's public ``info.parameter_status()``): CockroachDB sends ``crdb_version``, YugabyteDB's
    ``server_version`` carries ``-YB-``. They lack what lockkit's PostgreSQL backend relies on for some features
    (``pg_current_xact_id``/``pg_xact_status``, advisory locks, ``pg_control_system``).
    """
    driver: Any = connection.connection
    if driver is None:
        return None
    info = driver.info
    if info.parameter_status("crdb_version"):
        return "CockroachDB"
    if "-YB-" in str(info.parameter_status("server_version") or ""):
        return "YugabyteDB"
    return None


_servers: weakref.WeakKeyDictionary[Any, Server] = weakref.WeakKeyDictionary()


# libpq's PQTRANS_ACTIVE (a command in progress) and PQTRANS_INERROR (idle, in a failed transaction block).
_PQTRANS_ACTIVE = 1
_PQTRANS_INERROR = 3


class PostgreSQLFeatures(Features):
    """Transaction-scoped timeouts, advisory and table locks that end with the transaction, one-message sends."""

    claims_name = "PostgreSQL"
    watches_failed_statements = False  # libpq's transaction status says it (tx.aborted_by), no wrapper needed
    lock_waits_bound_end_with_transaction = True

    def timeout_support(self, connection: BaseDatabaseWrapper) -> tuple[str | None, str | None]:
        """Say how timeouts apply here: ``set_config(..., true)``, transaction-scoped."""
        return (
            "lock_timeout, transaction-scoped (set_config(..., true)), whole milliseconds",
            "statement_timeout, transaction-scoped (set_config(..., true)), whole milliseconds",
        )

    def server_warnings(self, connection: BaseDatabaseWrapper) -> list[str]:
        """Warn about a hot standby or ``default_transaction_read_only``; connects."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')")
            row = cursor.fetchone()
        assert row is not None
        if row[0]:
            return [
                "a read-only hot standby: locked scopes here raise ReadOnlyDatabase; route writes elsewhere"
            ]
        if row[1] == "on":
            return ["default_transaction_read_only is on: locked scopes here raise ReadOnlyDatabase"]
        return []

    def advisory_support(self, connection: BaseDatabaseWrapper) -> str | None:
        """Describe PostgreSQL advisory locks for ``lockkit_capabilities``."""
        return (
            "pg_advisory_xact_lock (scope) / pg_advisory_lock (session=True), exclusive and shared, "
            "bigint or (int, int) keys, waits bounded by lock_timeout"
        )

    def table_lock_support(self, connection: BaseDatabaseWrapper) -> str | None:
        """Describe ``lock_table`` here: ``LOCK TABLE``, transaction-scoped."""
        return "LOCK TABLE ... IN <mode> MODE [NOWAIT], all eight modes, until the transaction ends"

    def sends_one_message(self, connection: BaseDatabaseWrapper) -> bool:
        """The driver is psycopg 3 (Django's ``Database`` module); its cursor's binding is read on connecting."""
        wrapper: Any = connection  # Django's PostgreSQL wrapper (django-stubs types it as the base class)
        return bool(wrapper.Database.__name__ == "psycopg")


class PostgreSQLTransactions(Transactions):
    """Timeouts with ``is_local = true``: they end with the transaction.

    Nothing reaches the next user of a pooled connection. A nested scope (a savepoint) reads the enclosing values in
    the same round trip and puts them back when it ends; on error the savepoint rollback reverts them by itself.

    An outermost scope on psycopg 3 sends its ``BEGIN`` and its ``set_config`` at entry, in one message (see
    ``lockkit.backends.postgresql.opening``); on psycopg2 they are two statements. A connection lost at COMMIT is
    resolved with ``pg_xact_status``.
    """

    def apply_timeouts(
        self,
        connection: BaseDatabaseWrapper,
        *,
        lock_timeout: float | None,
        statement_timeout: float | None,
        nested: bool,
    ) -> TimeoutToken | None:
        """Set the timeouts for this transaction; a nested scope also reads the enclosing values to restore.

        An outermost scope on psycopg 3 that is about to send its ``BEGIN`` sends ``BEGIN; SELECT set_config(...),
        <opening columns>`` as one message (``opening``), with the milliseconds written as ``int`` literals;
        otherwise the values are parameters.
        """
        timeouts = {
            name: milliseconds(value)
            for name, value in zip(_NAMES, (lock_timeout, statement_timeout), strict=True)
            if value is not None
        }
        columns = () if nested else self.opening_columns(connection)
        if not timeouts and not columns:
            return None
        if not nested and opening.foldable(connection):
            opened = opening.begin_with_settings(connection, timeouts, columns)
            self.remember_server(connection, opened)
            return TimeoutToken({}, opened) if columns else None
        values = {name: f"{ms}ms" for name, ms in timeouts.items()}
        setters = [*("set_config(%s, %s, true)" for _ in values), *columns]
        params: list[str] = [item for pair in values.items() for item in pair]
        with connection.cursor() as cursor:
            if not nested:
                cursor.execute(f"SELECT {', '.join(setters)}", params)
                if not columns:
                    return None
                row = cursor.fetchone()
                assert row is not None
                opened = tuple(None if v is None else str(v) for v in row[len(values) :])
                self.remember_server(connection, opened)
                return TimeoutToken({}, opened)
            # The materialized CTE is read before the outer target list runs, so it sees the enclosing values.
            readers = ", ".join("current_setting(%s)" for _ in values)
            cursor.execute(
                f"WITH enclosing AS MATERIALIZED (SELECT {readers}) "
                f"SELECT enclosing.*, {', '.join(setters)} FROM enclosing",
                [*values, *params],
            )
            row = cursor.fetchone()
        assert row is not None
        return TimeoutToken(dict(zip(values, row[: len(values)], strict=True)))

    def restore_before_release(self, connection: BaseDatabaseWrapper, token: TimeoutToken) -> None:
        """Put the enclosing values back before the savepoint is released."""
        if not token.previous:
            return
        setters = ", ".join("set_config(%s, %s, true)" for _ in token.previous)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {setters}", [item for pair in token.previous.items() for item in pair])

    def connection_unusable(self, connection: BaseDatabaseWrapper) -> bool:
        """Read the driver's state, no round trip: psycopg marks a connection broken when its socket fails.

        psycopg 3 ``closed``/``broken``, psycopg2 ``closed``.
        """
        driver: Any = connection.connection
        return driver is None or bool(driver.closed or getattr(driver, "broken", False))

    def aborted_by(self, connection: BaseDatabaseWrapper) -> str | None:
        """The driver's transaction status is ``INERROR``: return the connection's last error message.

        Both drivers expose libpq's ``PQtransactionStatus`` and ``PQerrorMessage`` as ``info.transaction_status``
        and ``info.error_message`` (psycopg 3; psycopg2 2.8+). See
        https://www.psycopg.org/psycopg3/docs/api/objects.html#psycopg.ConnectionInfo.transaction_status.
        """
        driver: Any = connection.connection
        if driver is None or int(driver.info.transaction_status) != _PQTRANS_INERROR:
            return None
        return str(driver.info.error_message or "").strip()

    def cancel_in_flight(self, connection: BaseDatabaseWrapper) -> bool:
        """A statement's reply is pending (libpq's status ``ACTIVE``): send a cancel request.

        psycopg's ``cancel_safe()`` (3.2+) or ``cancel()``, both public and usable while the connection is busy. See
        https://www.psycopg.org/psycopg3/docs/api/connections.html#psycopg.Connection.cancel_safe.
        """
        driver: Any = connection.connection
        if driver is None or driver.closed or int(driver.info.transaction_status) != _PQTRANS_ACTIVE:
            return False
        cancel = getattr(driver, "cancel_safe", None) or driver.cancel
        with contextlib.suppress(Exception):  # the connection is discarded next in any case
            cancel()
        return True

    def opening_columns(self, connection: BaseDatabaseWrapper) -> tuple[str, ...]:
        """The transaction id (and the server's identity, once per connection), read by the opening statement.

        No extra round trip: the statement that opens an outermost scope reads them. Taking the id assigns one, which a locking transaction gets with its first row lock regardless. lockkit keeps
        it, with the server it was assigned by (``_SERVER_COLUMNS``), to resolve a COMMIT whose reply was lost
        (``commit_outcome``).
        """
        if distributed_sql(connection) is not None:
            return ()  # no transaction id to resolve a lost COMMIT with there: its outcome is unknown
        known = connection.connection in _servers
        return ("pg_current_xact_id()::text", *(() if known else _SERVER_COLUMNS))

    def remember_server(self, connection: BaseDatabaseWrapper, opened: tuple[str | None, ...]) -> None:
        """Keep the server's identity read by the opening, once per driver connection."""
        if len(opened) == 1 + len(_SERVER_COLUMNS):
            _servers[connection.connection] = (opened[1], opened[2])

    def transaction_server(self, connection: BaseDatabaseWrapper) -> Server | None:
        """The (system identifier, timeline) of the server the open connection reached, once a scope opened on it."""
        return _servers.get(connection.connection)

    def transaction_id(self, token: TimeoutToken | None) -> int | None:
        """``pg_current_xact_id()``, read by the statement that opened an outermost scope (``opening_columns``)."""
        opened = () if token is None else token.opened
        if not opened or opened[0] is None:
            return None
        return int(opened[0])

    def commit_outcome(
        self, connection: BaseDatabaseWrapper, xid: int | None, *, within: float, server: Any = None
    ) -> str | None:
        """Reconnect and ask ``pg_xact_status(xid)``, for up to ``within`` seconds, of the server that had it.

        The server reached now must be ``server`` (the system identifier and timeline the transaction's connection
        reached): after a failover the multi-host DSN reaches a promoted standby, a new timeline, which may have
        handed out the same transaction id to another transaction; its answer would be about that one, so the
        outcome is unknown (``None``). "in progress" means the server has not yet noticed the lost connection (or
        the COMMIT is still running); it is asked again until the answer is final or the time is up. See
        https://www.postgresql.org/docs/current/functions-info.html#FUNCTIONS-PG-SNAPSHOT.
        """
        if xid is None or server is None:
            return None
        deadline = time.monotonic() + within
        pause = _RESOLVE_PAUSE
        while True:
            try:
                if self.connection_unusable(connection):
                    connection.close()
                connection.ensure_connection()
                with connection.cursor() as cursor:
                    cursor.execute(f"SELECT {', '.join(_SERVER_COLUMNS)}")
                    reached = cursor.fetchone()
                    if reached is None or (reached[0], reached[1]) != tuple(server):
                        return None  # another server or timeline: it cannot say what became of ``xid``
                    cursor.execute("SELECT pg_xact_status(%s::text::xid8)", [str(xid)])
                    row = cursor.fetchone()
                status = row[0] if row else None
                if status in ("committed", "aborted"):
                    return str(status)
            except Error:
                connection.close()  # unreachable for now (a restart): try again with a fresh connection
            if time.monotonic() + pause > deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, _RESOLVE_PAUSE_MAX)


class PostgreSQLLocks(Locks):
    """``pg_advisory_*`` locks, ``LOCK TABLE`` and ``set_config('lock_timeout', ...)``: SQL in ``postgresql_locks``."""

    def check_advisory(self, connection: BaseDatabaseWrapper, *, shared: bool, session: bool) -> None:
        """Every form exists on PostgreSQL; none on CockroachDB or YugabyteDB reached through this backend.

        Raises:
            NotSupportedError: the server is a distributed SQL database (``distributed_sql``).
        """
        connection.ensure_connection()
        other = distributed_sql(connection)
        if other is not None:
            raise NotSupportedError(
                f"advisory locks are not supported on {other} ({connection.alias!r}): it has no pg_advisory_lock "
                "functions lockkit can rely on; lock a row instead"
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
        """Take the lock; the wait is bounded by the transaction's ``lock_timeout`` the scope has set.

        ``unless_held``: ``pg_locks`` is read in the same statement, before the lock is asked for.
        """
        return postgresql_locks.acquire(
            connection, key, shared=shared, session=session, nowait=nowait, unless_held=unless_held
        )

    def release_advisory(
        self, connection: BaseDatabaseWrapper, key: AdvisoryKey, *, shared: bool
    ) -> tuple[bool, int | None]:
        """``pg_advisory_unlock``: release one hold of a session-level lock."""
        return postgresql_locks.release(connection, key, shared=shared)

    def advisory_holders(
        self, connection: BaseDatabaseWrapper, key: AdvisoryKey, *, shared: bool
    ) -> tuple[int, ...] | None:
        """The sessions ``pg_locks`` shows holding ``key`` (exclusively, for a ``shared`` request)."""
        return postgresql_locks.holders(connection, key, shared=shared)

    def check_table_lock(self, connection: BaseDatabaseWrapper, mode: TableLockMode) -> None:
        """Every mode is supported: ``LOCK TABLE`` always ends with the transaction."""

    def lock_tables(
        self, connection: BaseDatabaseWrapper, tables: list[str], mode: TableLockMode, *, nowait: bool
    ) -> None:
        """``LOCK TABLE ... IN <mode> MODE [NOWAIT]``, partitions included; waits obey ``lock_timeout``."""
        postgresql_locks.lock_tables(connection, tables, mode, nowait=nowait)

    def bound_lock_waits(
        self, connection: BaseDatabaseWrapper, lock_timeout: float, *, in_transaction: bool
    ) -> TimeoutToken:
        """``set_config('lock_timeout', ..., is_local)``: transaction-scoped inside a transaction."""
        # is_local = true ends with the transaction by itself; outside one it is the session's, restored after.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, %s)",
                [f"{milliseconds(lock_timeout)}ms", in_transaction],
            )
            row = cursor.fetchone()
        assert row is not None
        return TimeoutToken({"lock_timeout": row[0]})

    def unbound_lock_waits(self, connection: BaseDatabaseWrapper, token: TimeoutToken) -> None:
        """Put the session-level ``lock_timeout`` back (closing the connection if that fails)."""
        # Only called for a session-level bound: a transaction-scoped one ends with its transaction.
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('lock_timeout', %s, false)", [token.previous["lock_timeout"]]
                )
        except BaseException:
            if not connection.in_atomic_block:
                connection.close()
            raise


class PostgreSQLSessions(Sessions):
    """Backend pids, ``pg_stat_activity``, ``pg_locks`` and ``pg_blocking_pids()``: SQL in ``postgresql_locks``."""

    def local_session_id(self, connection: BaseDatabaseWrapper) -> int | None:
        """The backend pid the driver recorded when it connected (``info.backend_pid``, no round trip)."""
        driver: Any = connection.connection
        return None if driver is None else int(driver.info.backend_pid)

    def session_pid(self, connection: BaseDatabaseWrapper) -> int:
        """``pg_backend_pid()``."""
        return postgresql_locks.session_pid(connection)

    def session_database(self, connection: BaseDatabaseWrapper, pid: int) -> tuple[str | None, bool, bool]:
        """``pg_stat_activity``: the database session ``pid`` is connected to."""
        return postgresql_locks.session_database(connection, pid)

    def session_ended(self, connection: BaseDatabaseWrapper, pid: int) -> bool | None:
        """``pg_stat_activity``: no session ``pid`` on this server, or one that is idle (no transaction open).

        ``None`` when this connection's ``pg_backend_pid()`` is not the pid its driver was given: a pooler
        (PgBouncer gives clients keys of its own), so ``pid`` names no server session.
        """
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_backend_pid(), (SELECT state FROM pg_stat_activity WHERE pid = %s)", [pid]
            )
            row = cursor.fetchone()
        assert row is not None
        if row[0] != self.local_session_id(connection):
            return None
        return row[1] is None or row[1] == "idle"

    def server_statement_timeout(self, connection: BaseDatabaseWrapper) -> float | None:
        """``statement_timeout`` as the session has it outside any scope (``pg_settings``, milliseconds)."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT setting::float8 FROM pg_settings WHERE name = 'statement_timeout'")
            row = cursor.fetchone()
        return float(row[0]) / 1000 if row and row[0] else None

    def lock_waits(self, connection: BaseDatabaseWrapper, alias: str) -> list[LockWait]:
        """Read ``pg_locks`` and ``pg_blocking_pids()`` for the sessions of this database."""
        return postgresql_locks.lock_waits(connection, alias)

    def signal_target(self, connection: BaseDatabaseWrapper, pid: int) -> SessionTarget | None:
        """``pg_stat_activity``: the database and the ``backend_type`` of session ``pid``."""
        return postgresql_locks.signal_target(connection, pid)

    def signal_session(self, connection: BaseDatabaseWrapper, pid: int, *, terminate: bool) -> bool:
        """``pg_cancel_backend`` or ``pg_terminate_backend``, of a client backend of this database only."""
        return postgresql_locks.signal(connection, pid, terminate=terminate)

    def check_prioritize(self, connection: BaseDatabaseWrapper) -> None:
        """Supported: ``pg_blocking_pids()`` names a session's blockers."""

    def client_blockers(self, connection: BaseDatabaseWrapper, pid: int, *, waited: float) -> list[Session]:
        """``pg_blocking_pids(pid)``, client backends of this database only, once ``pid`` waited ``waited`` s."""
        return postgresql_locks.client_blockers(connection, pid, waited=waited)

    def contention_sql(self, connection: BaseDatabaseWrapper) -> ContentionSQL:
        """``pg_backend_pid()``, ``pg_cancel_backend()``, ``pg_blocking_pids()`` and ``pg_locks``."""
        return postgresql_locks.POSTGRESQL


class PostgreSQLBackend(Backend):
    """PostgreSQL's parts (psycopg 3 or psycopg2)."""

    features_class = PostgreSQLFeatures
    transactions_class = PostgreSQLTransactions
    locks_class = PostgreSQLLocks
    sessions_class = PostgreSQLSessions


# Pauses between two questions about a lost COMMIT's outcome, in seconds (doubling up to the maximum).
_RESOLVE_PAUSE = 0.05
_RESOLVE_PAUSE_MAX = 0.5
