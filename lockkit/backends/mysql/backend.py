"""MariaDB's and MySQL's parts: scope timeouts as session variables, restored when the scope ends, success or error.

https://mariadb.com/kb/en/innodb-system-variables/#innodb_lock_wait_timeout,
https://mariadb.com/kb/en/aborting-statements/ (``max_statement_time``) and
https://dev.mysql.com/doc/refman/8.0/en/server-system-variables.html#sysvar_max_execution_time
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
from lockkit.backends.mysql import locks as mysql_locks

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from lockkit.advisory.keys import AdvisoryKey
    from lockkit.backends.waits import LockWait, SessionTarget
    from lockkit.tablemodes import TableLockMode

# innodb_lock_wait_timeout accepts whole seconds from 1 to 1073741824.
_MAX_LOCK_WAIT = 1_073_741_824


def lock_wait_seconds(value: float) -> int:
    """Round a lock timeout up to whole seconds, at least 1: a scope never waits less than it asked for."""
    return min(_MAX_LOCK_WAIT, max(1, math.ceil(value)))


def _statement_timeout(connection: BaseDatabaseWrapper, value: float) -> tuple[str, float | int]:
    """Return the variable and value of a statement timeout: seconds on MariaDB, milliseconds on MySQL."""
    if connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        # max_statement_time is seconds with microsecond precision; 0 would mean "no limit".
        return "max_statement_time", max(0.000001, round(value, 6))
    # MySQL's max_execution_time applies to read-only SELECT statements only, in milliseconds.
    return "max_execution_time", max(1, round(value * 1000))


class MySQLFeatures(Features):
    """``SKIP LOCKED`` from MariaDB 10.6/MySQL 8, session-scoped timeouts, ``GET_LOCK`` named locks, no table locks."""

    claims_name = "MariaDB 10.6+/MySQL 8"
    advisory_locks_end_with_transaction = False  # GET_LOCK locks are the session's: the scope releases them

    def claims_supported(self, connection: BaseDatabaseWrapper) -> bool:
        """``SKIP LOCKED``: MariaDB 10.6, MySQL 8.0.1."""
        return bool(connection.features.has_select_for_update_skip_locked)

    def timeout_support(self, connection: BaseDatabaseWrapper) -> tuple[str | None, str | None]:
        """Say how timeouts apply here: session variables, restored when the scope ends."""
        statement = (
            "max_statement_time, session value restored on exit, microseconds"
            if connection.mysql_is_mariadb  # type: ignore[attr-defined]
            else "max_execution_time (SELECT only), session value restored on exit, whole milliseconds"
        )
        return (
            "innodb_lock_wait_timeout (row locks) and lock_wait_timeout (metadata locks), session values restored on "
            "exit, whole seconds rounded up",
            statement,
        )

    def server_warnings(self, connection: BaseDatabaseWrapper) -> list[str]:
        """Warn when the server is read-only (``@@GLOBAL.read_only``)."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@GLOBAL.read_only")
            row = cursor.fetchone()
        assert row is not None
        if row[0]:
            return ["the server is read-only (read_only=ON): locked scopes here raise ReadOnlyDatabase"]
        return []

    def advisory_support(self, connection: BaseDatabaseWrapper) -> str | None:
        """Describe ``GET_LOCK`` named locks for ``lockkit_capabilities``."""
        return (
            "GET_LOCK/RELEASE_LOCK named locks (per database, released at scope end), exclusive only, "
            "waits bounded by GET_LOCK's own timeout (fractions of a second)"
        )


class MySQLTransactions(Transactions):
    """The lock waits (``innodb_lock_wait_timeout``, ``lock_wait_timeout``) and statement time of a session.

    ``max_statement_time`` on MariaDB, ``max_execution_time`` on MySQL.

    Neither server has a transaction-scoped form of these settings, and a rollback (to a savepoint or of the
    whole transaction) does not revert ``SET SESSION``. So a scope reads the session values, sets its own, and
    puts the previous ones back once its transaction or savepoint has ended, after success and after failure
    alike: nothing reaches the next user of the connection, and an enclosing scope gets its own value back.
    """

    def apply_timeouts(
        self,
        connection: BaseDatabaseWrapper,
        *,
        lock_timeout: float | None,
        statement_timeout: float | None,
        nested: bool,
    ) -> TimeoutToken | None:
        """Set the session variables and return their previous values (a rollback does not revert them)."""
        wanted: dict[str, float | int] = {}
        if lock_timeout is not None:
            # Row locks (InnoDB) and metadata locks (a DDL, LOCK TABLES, FLUSH TABLES holder: lock_wait_timeout,
            # a year by default) are waited for under two settings; a scope bounds both.
            wanted["innodb_lock_wait_timeout"] = lock_wait_seconds(lock_timeout)
            wanted["lock_wait_timeout"] = lock_wait_seconds(lock_timeout)
        if statement_timeout is not None:
            name, value = _statement_timeout(connection, statement_timeout)
            wanted[name] = value
        if not wanted:
            return None
        # The names are constants of ours; the values always travel as parameters.
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(f"@@SESSION.{name}" for name in wanted))
            row = cursor.fetchone()
            assert row is not None
            previous = TimeoutToken(dict(zip(wanted, row, strict=True)))
            _set(cursor, wanted)
        return previous

    def statement_settings(
        self, connection: BaseDatabaseWrapper, *, lock_timeout: float | None, statement_timeout: float | None
    ) -> str | None:
        """MariaDB: ``SET STATEMENT innodb_lock_wait_timeout=N, lock_wait_timeout=N[, max_statement_time=S] FOR``.

        The values last for the one statement, so nothing is read, set or put back per call. They are numbers
        lockkit computed from validated durations (whole seconds; whole microseconds), written as
        literals: ``SET STATEMENT`` takes no parameters. MySQL has no such form for these variables: ``None``.
        See https://mariadb.com/kb/en/set-statement/.
        """
        if not connection.mysql_is_mariadb:  # type: ignore[attr-defined]
            return None
        wanted: list[str] = []
        if lock_timeout is not None:
            seconds = int(lock_wait_seconds(lock_timeout))
            wanted += [f"innodb_lock_wait_timeout={seconds}", f"lock_wait_timeout={seconds}"]
        if statement_timeout is not None:
            # A whole number of microseconds lockkit computed, written as seconds: "S.UUUUUU".
            micros = max(1, round(float(_statement_timeout(connection, statement_timeout)[1]) * 1_000_000))
            wanted.append(f"max_statement_time={micros // 1_000_000}.{micros % 1_000_000:06d}")
        return f"SET STATEMENT {', '.join(wanted)} FOR " if wanted else ""

    def after_transaction_end(
        self, connection: BaseDatabaseWrapper, token: TimeoutToken, *, nested: bool
    ) -> None:
        """Put the previous session values back; close the connection if that fails outside a transaction.

        On every path, including a body that ended the transaction with its own ``BEGIN``, ``COMMIT``,
        ``ROLLBACK`` or ``SET autocommit`` (the savepoint is then gone and Django marks the block for rollback).
        """
        _restore(connection, token.previous)


class MySQLLocks(Locks):
    """``GET_LOCK``/``RELEASE_LOCK``: session-level named locks, so the scope releases them itself; exclusive only.

    No table locks (``LOCK TABLES`` commits the transaction); DDL's lock waits bounded by session variables.
    """

    def check_advisory(self, connection: BaseDatabaseWrapper, *, shared: bool, session: bool) -> None:
        """Refuse ``shared=True``: ``GET_LOCK`` locks are exclusive."""
        if shared:
            raise NotSupportedError(
                f"shared advisory locks are not supported on {connection.vendor} ({connection.alias!r}): "
                "GET_LOCK locks are exclusive"
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
        """``GET_LOCK(name, timeout)``: the wait is bounded by its own timeout (0 with ``nowait``).

        ``unless_held``: ``IS_USED_LOCK`` is read in the same statement, before ``GET_LOCK`` runs.
        """
        self.check_advisory(connection, shared=shared, session=session)
        return mysql_locks.acquire(connection, key, timeout=0 if nowait else timeout, unless_held=unless_held)

    def release_advisory(
        self, connection: BaseDatabaseWrapper, key: AdvisoryKey, *, shared: bool
    ) -> tuple[bool, int | None]:
        """``RELEASE_LOCK(name)``: release this session's hold."""
        return mysql_locks.release(connection, key)

    def advisory_holders(
        self, connection: BaseDatabaseWrapper, key: AdvisoryKey, *, shared: bool
    ) -> tuple[int, ...] | None:
        """The other connection holding ``key`` (``IS_USED_LOCK``), if any."""
        return mysql_locks.holders(connection, key)

    def check_table_lock(self, connection: BaseDatabaseWrapper, mode: TableLockMode) -> None:
        """Refuse every mode: ``LOCK TABLES`` cannot be a lock of the scope's transaction."""
        raise NotSupportedError(
            f"lock_table() is not supported on {connection.vendor} ({connection.alias!r}): LOCK TABLES commits "
            "the open transaction (the scope's earlier work included) and holds its locks until UNLOCK TABLES, "
            "past the end of the scope, so it cannot be a lock of the scope's transaction; lock the rows instead "
            "(scope.lock_all(), or scope.lock() of the rows the decision reads), or use scope.advisory_lock() "
            "for one key the writers of the table agree on"
        )

    def bound_lock_waits(
        self, connection: BaseDatabaseWrapper, lock_timeout: float, *, in_transaction: bool
    ) -> TimeoutToken:
        """Set ``lock_wait_timeout`` and ``innodb_lock_wait_timeout`` for the session, in whole seconds."""
        # DDL waits for metadata locks (lock_wait_timeout), data statements for row locks
        # (innodb_lock_wait_timeout); both are session variables in whole seconds, restored by the caller.
        wanted: dict[str, float | int] = {
            "lock_wait_timeout": lock_wait_seconds(lock_timeout),
            "innodb_lock_wait_timeout": lock_wait_seconds(lock_timeout),
        }
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(f"@@SESSION.{name}" for name in wanted))
            row = cursor.fetchone()
            assert row is not None
            previous = dict(zip(wanted, row, strict=True))
            _set(cursor, wanted)
        return TimeoutToken(previous)

    def unbound_lock_waits(self, connection: BaseDatabaseWrapper, token: TimeoutToken) -> None:
        """Put the session variables back (closing the connection if that fails outside a transaction)."""
        _restore(connection, token.previous)


class MySQLSessions(Sessions):
    """Connection ids, ``information_schema.processlist``, the InnoDB lock-wait views and ``KILL``."""

    def local_session_id(self, connection: BaseDatabaseWrapper) -> int | None:
        """The connection id mysqlclient recorded (``thread_id()``, no round trip)."""
        driver: Any = connection.connection
        return None if driver is None else int(driver.thread_id())

    def session_database(self, connection: BaseDatabaseWrapper, pid: int) -> tuple[str | None, bool, bool]:
        """``information_schema.processlist``: the database session ``pid`` is connected to."""
        return mysql_locks.session_database(connection, pid)

    def session_ended(self, connection: BaseDatabaseWrapper, pid: int) -> bool | None:
        """No session ``pid`` in ``information_schema.processlist``, or one sleeping with no InnoDB transaction.

        ``None`` when this connection's ``CONNECTION_ID()`` is not the id its driver reports (a proxy between).
        """
        return mysql_locks.session_ended(connection, pid, self.local_session_id(connection))

    def server_statement_timeout(self, connection: BaseDatabaseWrapper) -> float | None:
        """``max_statement_time`` (MariaDB, seconds) / ``max_execution_time`` (MySQL, milliseconds), 0 = none."""
        mariadb = bool(getattr(connection, "mysql_is_mariadb", False))
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT @@SESSION.max_statement_time" if mariadb else "SELECT @@SESSION.max_execution_time"
            )
            row = cursor.fetchone()
        value = float(row[0]) if row and row[0] else 0.0
        return (value if mariadb else value / 1000) or None

    def lock_waits(self, connection: BaseDatabaseWrapper, alias: str) -> list[LockWait]:
        """Read the InnoDB lock-wait views, ``GET_LOCK`` and metadata-lock waits of this database."""
        return mysql_locks.lock_waits(connection, alias)

    def signal_target(self, connection: BaseDatabaseWrapper, pid: int) -> SessionTarget | None:
        """``information_schema.processlist``: the database, command and user of session ``pid``."""
        return mysql_locks.signal_target(connection, pid)

    def signal_session(self, connection: BaseDatabaseWrapper, pid: int, *, terminate: bool) -> bool:
        """``KILL QUERY`` or ``KILL CONNECTION`` session ``pid``."""
        return mysql_locks.signal(connection, pid, terminate=terminate)

    def contention_sql(self, connection: BaseDatabaseWrapper) -> ContentionSQL:
        """``CONNECTION_ID()``, ``KILL QUERY`` and the InnoDB lock-wait views (MariaDB's or MySQL 8's)."""
        return mysql_locks.MARIADB if getattr(connection, "mysql_is_mariadb", False) else mysql_locks.MYSQL


class MySQLBackend(Backend):
    """MariaDB's and MySQL's parts (mysqlclient)."""

    features_class = MySQLFeatures
    transactions_class = MySQLTransactions
    locks_class = MySQLLocks
    sessions_class = MySQLSessions


def _set(cursor: object, values: Mapping[str, str | float | int]) -> None:
    assignments = ", ".join(f"SESSION {name} = %s" for name in values)
    cursor.execute(f"SET {assignments}", list(values.values()))  # type: ignore[attr-defined]


def _restore(connection: BaseDatabaseWrapper, values: Mapping[str, str | float | int]) -> None:
    """Put session variables back, even in a block Django has marked for rollback.

    ``SET SESSION`` is not transactional here: neither a rollback nor an aborted block reverts it, and the server
    runs it in any transaction state. Django's cursor refuses every statement once a block needs rollback
    (``TransactionManagementError``), which happens when the body ended the scope's transaction itself and the
    savepoint could not be rolled back to; the value then goes through the driver's own cursor (DB-API), with
    Django's error wrapping, so it never stays behind on the connection.
    """
    if connection.connection is None:
        return  # closed (it died, or was discarded): the next connection starts from the server's own values
    try:
        if connection.needs_rollback:
            connection.validate_thread_sharing()
            with connection.wrap_database_errors, connection.connection.cursor() as cursor:
                _set(cursor, values)
        else:
            with connection.cursor() as cursor:
                _set(cursor, values)
    except BaseException:
        if not connection.in_atomic_block:
            # A session whose settings could not be put back must not serve anyone else.
            connection.close()
        raise
