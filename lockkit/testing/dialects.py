"""The SQL the toolkit asks each database for: session id, cancelling a statement, who waits for whose lock.

One row per vendor (PostgreSQL, MariaDB, MySQL 8); ``sessions``, ``blocking`` and ``monitor`` read it here and
nowhere else. Every text is constant; the one value (a session id) is always a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.backends.base.base import BaseDatabaseWrapper


@dataclass(frozen=True)
class Dialect:
    """What the toolkit runs on one vendor.

    Attributes:
        name: ``"postgresql"``, ``"mariadb"`` or ``"mysql"``.
        session_id: Returns this connection's session id (one row, one column).
        session_exists: Counts the sessions with the id given as the one parameter.
        cancel: Cancels the statement of the session given as the one parameter (the session stays open).
        blocking_edges: Returns ``(waiting session, blocking session)`` rows, one per direct lock wait.
        lock_waits: Returns ``(waiting session, lock kind, holding session or NULL)`` rows for the current
            database's sessions, leaving out the asking session itself.
        min_poll: The shortest useful pause between two reads of the lock-wait views, in seconds.
    """

    name: str
    session_id: str
    session_exists: str
    cancel: str
    blocking_edges: str
    lock_waits: str
    min_poll: float


POSTGRESQL = Dialect(
    name="postgresql",
    session_id="SELECT pg_backend_pid()",
    session_exists="SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
    cancel="SELECT pg_cancel_backend(%s)",
    blocking_edges=(
        "SELECT waiting.pid, blocker FROM pg_stat_activity AS waiting "
        "CROSS JOIN LATERAL unnest(pg_blocking_pids(waiting.pid)) AS blocker "
        "WHERE waiting.wait_event_type = 'Lock'"
    ),
    # Every lock request not granted (a row lock wait shows as a wait for the holder's transactionid, or for a
    # tuple lock), with the session holding that lock. pg_locks is read once (the materialized CTE), so waiter
    # and holder come from one consistent view of the lock manager. See
    # https://www.postgresql.org/docs/current/view-pg-locks.html.
    lock_waits=(
        "WITH l AS MATERIALIZED (SELECT * FROM pg_locks) "
        "SELECT w.pid, w.locktype, h.pid FROM l w "
        "LEFT JOIN l h ON h.granted AND h.pid <> w.pid AND h.locktype = w.locktype "
        "AND h.database IS NOT DISTINCT FROM w.database AND h.relation IS NOT DISTINCT FROM w.relation "
        "AND h.page IS NOT DISTINCT FROM w.page AND h.tuple IS NOT DISTINCT FROM w.tuple "
        "AND h.transactionid IS NOT DISTINCT FROM w.transactionid "
        "AND h.virtualxid IS NOT DISTINCT FROM w.virtualxid AND h.classid IS NOT DISTINCT FROM w.classid "
        "AND h.objid IS NOT DISTINCT FROM w.objid AND h.objsubid IS NOT DISTINCT FROM w.objsubid "
        "WHERE NOT w.granted AND w.pid <> pg_backend_pid() "
        "AND w.pid IN (SELECT pid FROM pg_stat_activity WHERE datname = current_database())"
    ),
    min_poll=0.0,
)

# InnoDB refreshes its information_schema lock tables only when they were not read for 100 ms
# (CACHE_MIN_IDLE_TIME_US in trx0i_s.cc): polling faster would read a stale snapshot forever.
_INNODB_MIN_POLL = 0.15

MARIADB = Dialect(
    name="mariadb",
    session_id="SELECT CONNECTION_ID()",
    session_exists="SELECT count(*) FROM information_schema.processlist WHERE id = %s",
    cancel="KILL QUERY %s",
    blocking_edges=(
        "SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id FROM information_schema.innodb_lock_waits w "
        "JOIN information_schema.innodb_trx r ON r.trx_id = w.requesting_trx_id "
        "JOIN information_schema.innodb_trx b ON b.trx_id = w.blocking_trx_id"
        # A session waiting in GET_LOCK (lockkit.advisory_lock): the lock name is the statement's first quoted
        # text, and IS_USED_LOCK names its holder. https://mariadb.com/kb/en/get_lock/
        " UNION ALL SELECT p.id, IS_USED_LOCK(SUBSTRING_INDEX(SUBSTRING_INDEX(p.info, CHAR(39), 2), CHAR(39), -1)) "
        "FROM information_schema.processlist p WHERE p.state = 'User lock' "
        "AND IS_USED_LOCK(SUBSTRING_INDEX(SUBSTRING_INDEX(p.info, CHAR(39), 2), CHAR(39), -1)) IS NOT NULL"
        # DDL waiting for a table's metadata lock: the server does not say who holds it (without the
        # metadata_lock_info plugin), so every other open transaction of the database is a candidate.
        " UNION ALL SELECT p.id, t.trx_mysql_thread_id FROM information_schema.processlist p "
        "JOIN information_schema.innodb_trx t ON t.trx_mysql_thread_id <> p.id "
        "JOIN information_schema.processlist tp ON tp.id = t.trx_mysql_thread_id AND tp.db <=> p.db "
        "WHERE p.state = 'Waiting for table metadata lock'"
    ),
    # https://mariadb.com/kb/en/information-schema-innodb_lock_waits-table/; lock kind: RECORD or TABLE.
    lock_waits=(
        "SELECT r.trx_mysql_thread_id, l.lock_type, b.trx_mysql_thread_id "
        "FROM information_schema.innodb_lock_waits w "
        "JOIN information_schema.innodb_locks l ON l.lock_id = w.requested_lock_id "
        "JOIN information_schema.innodb_trx r ON r.trx_id = w.requesting_trx_id "
        "LEFT JOIN information_schema.innodb_trx b ON b.trx_id = w.blocking_trx_id "
        "JOIN information_schema.processlist p ON p.id = r.trx_mysql_thread_id "
        "WHERE p.db = DATABASE() AND r.trx_mysql_thread_id <> CONNECTION_ID()"
    ),
    min_poll=_INNODB_MIN_POLL,
)

MYSQL = Dialect(
    name="mysql",
    session_id="SELECT CONNECTION_ID()",
    session_exists="SELECT count(*) FROM information_schema.processlist WHERE id = %s",
    cancel="KILL QUERY %s",
    blocking_edges=(
        "SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id FROM performance_schema.data_lock_waits w "
        "JOIN information_schema.innodb_trx r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID "
        "JOIN information_schema.innodb_trx b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID"
    ),
    # https://dev.mysql.com/doc/refman/8.0/en/performance-schema-data-lock-waits-table.html
    lock_waits=(
        "SELECT r.trx_mysql_thread_id, l.LOCK_TYPE, b.trx_mysql_thread_id "
        "FROM performance_schema.data_lock_waits w "
        "JOIN performance_schema.data_locks l ON l.ENGINE_LOCK_ID = w.REQUESTING_ENGINE_LOCK_ID "
        "JOIN information_schema.innodb_trx r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID "
        "LEFT JOIN information_schema.innodb_trx b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID "
        "WHERE l.OBJECT_SCHEMA = DATABASE() AND r.trx_mysql_thread_id <> CONNECTION_ID()"
    ),
    min_poll=_INNODB_MIN_POLL,
)


def dialect_of(connection: BaseDatabaseWrapper) -> Dialect:
    """Return the ``Dialect`` of ``connection``'s database.

    Raises:
        NotImplementedError: the database is neither PostgreSQL nor MariaDB/MySQL (SQLite has no sessions to
            wait on: one writer at a time, no lock-wait views).
    """
    if connection.vendor == "postgresql":
        return POSTGRESQL
    if connection.vendor == "mysql":
        return MARIADB if getattr(connection, "mysql_is_mariadb", False) else MYSQL
    if connection.vendor == "sqlite":
        raise NotImplementedError(
            f"the contention toolkit (hold_lock, wait_until_blocked, blocked_by, backend_pid) does not support "
            f"SQLite ({connection.alias!r}): SQLite has no row locks and no server sessions to observe (a lockkit "
            "scope there takes the whole database's write lock at BEGIN IMMEDIATE). Test contention on PostgreSQL "
            "or MariaDB/MySQL; on SQLite two scopes simply run one after the other, and a wait longer than "
            "lock_timeout raises LockTimeout"
        )
    raise NotImplementedError(
        f"the contention toolkit does not support {connection.vendor} ({connection.alias!r}): it needs "
        "PostgreSQL or MariaDB/MySQL, whose sessions can wait for each other's row locks"
    )


__all__ = ["MARIADB", "MYSQL", "POSTGRESQL", "Dialect", "dialect_of"]
