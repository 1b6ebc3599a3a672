"""MariaDB/MySQL named locks (``GET_LOCK``), lock-wait inspection and ``KILL``: the SQL, in one place.

https://mariadb.com/kb/en/get_lock/, https://mariadb.com/kb/en/information-schema-innodb_lock_waits-table/,
https://mariadb.com/kb/en/information-schema-processlist-table/ and https://mariadb.com/kb/en/kill/
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from django.db import OperationalError

from lockkit.backends.base import ContentionSQL
from lockkit.backends.waits import OTHER_DATABASE, LockWait, Session, SessionTarget

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from lockkit.advisory.keys import AdvisoryKey

# GET_LOCK's timeout when the scope has none: a year, like lock_wait_timeout's default (a negative value, "wait
# forever" on MySQL, makes MariaDB return NULL).
UNBOUNDED_WAIT = 31_536_000

# lockkit's lock names are [a-z0-9_:] plus the database name; the waiting statement names it as a literal.
_GET_LOCK_NAME = re.compile(r"GET_LOCK\(\s*'((?:[^'\\]|\\.|'')*)'", re.IGNORECASE)
# The table a DDL statement names, for a metadata-lock wait's target (best effort).
_DDL_TABLE = re.compile(r"^\s*(?:ALTER|DROP|TRUNCATE|RENAME|OPTIMIZE)\s+TABLE\s+`?([\w$.]+)`?", re.IGNORECASE)


def lock_name(connection: BaseDatabaseWrapper, key: AdvisoryKey) -> str:
    """The ``GET_LOCK`` name of ``key`` in the connection's database (names are server-wide: keep databases apart)."""
    return key.lock_name(str(connection.settings_dict["NAME"]))


def acquire(
    connection: BaseDatabaseWrapper, key: AdvisoryKey, *, timeout: float | None, unless_held: bool = False
) -> tuple[bool | None, int]:
    """``GET_LOCK(name, timeout)``: return whether it was granted (0: the wait expired) and the connection id.

    With ``unless_held``, the same statement first asks ``IS_USED_LOCK`` whether this connection already holds
    the name (``GET_LOCK`` is re-entrant) and, if it does, takes nothing and returns ``None``.

    Raises:
        django.db.OperationalError: ``GET_LOCK`` returned ``NULL``: the statement was killed (``KILL QUERY``).
    """
    wait = UNBOUNDED_WAIT if timeout is None else timeout
    name = lock_name(connection, key)
    with connection.cursor() as cursor:
        if unless_held:
            # IF() evaluates its condition first: -1 (never a GET_LOCK result) when this connection holds it.
            cursor.execute(
                "SELECT IF(IS_USED_LOCK(%s) <=> CONNECTION_ID(), -1, GET_LOCK(%s, %s)), CONNECTION_ID()",
                [name, name, wait],
            )
        else:
            cursor.execute("SELECT GET_LOCK(%s, %s), CONNECTION_ID()", [name, wait])
        row = cursor.fetchone()
    assert row is not None
    if row[0] is None:
        raise OperationalError(f"GET_LOCK({name!r}) was interrupted (KILL QUERY or an error in the server)")
    if int(row[0]) == -1:
        return None, int(row[1])
    return bool(row[0]), int(row[1])


def release(connection: BaseDatabaseWrapper, key: AdvisoryKey) -> tuple[bool, int]:
    """``RELEASE_LOCK(name)``: return whether this connection held it (1) and the connection id."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT RELEASE_LOCK(%s), CONNECTION_ID()", [lock_name(connection, key)])
        row = cursor.fetchone()
    assert row is not None
    return row[0] == 1, int(row[1])


def held(connection: BaseDatabaseWrapper, key: AdvisoryKey) -> int | None:
    """The id of the connection holding ``key`` (``IS_USED_LOCK``), or ``None`` when it is free."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s)", [lock_name(connection, key)])
        row = cursor.fetchone()
    return None if row is None or row[0] is None else int(row[0])


def holders(connection: BaseDatabaseWrapper, key: AdvisoryKey) -> tuple[int, ...]:
    """The other connection holding ``key`` (``IS_USED_LOCK``; it takes no lock, so it cannot wait), if any."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s), CONNECTION_ID()", [lock_name(connection, key)])
        row = cursor.fetchone()
    if row is None or row[0] is None or int(row[0]) == int(row[1]):
        return ()
    return (int(row[0]),)


# InnoDB row and table lock waits of this database's sessions (MariaDB's information_schema tables; MySQL 8 moved
# them to performance_schema.data_lock_waits).
_INNODB_WAITS = """
SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id, l.lock_type, l.lock_mode, l.lock_table, l.lock_index,
       TIMESTAMPDIFF(MICROSECOND, r.trx_wait_started, NOW(6)) / 1000000
FROM information_schema.innodb_lock_waits AS w
JOIN information_schema.innodb_trx AS r ON r.trx_id = w.requesting_trx_id
JOIN information_schema.innodb_trx AS b ON b.trx_id = w.blocking_trx_id
JOIN information_schema.innodb_locks AS l ON l.lock_id = w.requested_lock_id
JOIN information_schema.processlist AS p ON p.id = r.trx_mysql_thread_id
WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()
"""
_MYSQL8_WAITS = """
SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id, l.LOCK_TYPE, l.LOCK_MODE,
       CONCAT(l.OBJECT_SCHEMA, '.', l.OBJECT_NAME), l.INDEX_NAME,
       TIMESTAMPDIFF(MICROSECOND, r.trx_wait_started, NOW(6)) / 1000000
FROM performance_schema.data_lock_waits AS w
JOIN information_schema.innodb_trx AS r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID
JOIN information_schema.innodb_trx AS b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID
JOIN performance_schema.data_locks AS l ON l.ENGINE_LOCK_ID = w.REQUESTING_ENGINE_LOCK_ID
JOIN information_schema.processlist AS p ON p.id = r.trx_mysql_thread_id
WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()
"""
# DDL (or LOCK TABLES) waiting for a table's metadata lock. Without the metadata_lock_info plugin the server does
# not say who holds it: every session of this database with an open transaction is a candidate.
_METADATA_LOCK_WAITS = """
SELECT id, info, time_ms / 1000 FROM information_schema.processlist
WHERE state = 'Waiting for table metadata lock' AND db = DATABASE() AND id <> CONNECTION_ID()
"""
_OPEN_TRANSACTIONS = """
SELECT t.trx_mysql_thread_id FROM information_schema.innodb_trx AS t
JOIN information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id
WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()
"""
# Sessions waiting in GET_LOCK: the lock name is in the statement text, IS_USED_LOCK names its holder.
_USER_LOCK_WAITS = """
SELECT id, info, time_ms / 1000 FROM information_schema.processlist
WHERE state = 'User lock' AND db = DATABASE() AND id <> CONNECTION_ID()
"""


def _sessions(cursor: Any, pids: list[int]) -> dict[int, Session]:
    if not pids:
        return {}
    placeholders = ", ".join(["%s"] * len(pids))
    cursor.execute(
        "SELECT p.id, p.user, p.info, COALESCE(NULLIF(p.state, ''), p.command), "
        "TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1000000 "
        "FROM information_schema.processlist AS p "
        "LEFT JOIN information_schema.innodb_trx AS t ON t.trx_mysql_thread_id = p.id "
        # Sessions of this database only: another database's blocker is named by its id alone.
        f"WHERE p.id IN ({placeholders}) AND p.db <=> DATABASE()",
        pids,
    )
    found: dict[int, Session] = {}
    for pid, user, query, state, age in cursor.fetchall():
        found[int(pid)] = Session(int(pid), None, user, query, state, None if age is None else float(age))
    return found


def lock_waits(connection: BaseDatabaseWrapper, alias: str) -> list[LockWait]:
    """Return the InnoDB and ``GET_LOCK`` waits of the connection's database, without chains."""
    is_mariadb = bool(getattr(connection, "mysql_is_mariadb", False))
    # (waiter, kind, target) -> (blockers, mode, seconds waited): InnoDB reports one row per blocker.
    found: dict[tuple[int, str, str | None], tuple[list[int], str | None, float | None]] = {}
    with connection.cursor() as cursor:
        cursor.execute(_INNODB_WAITS if is_mariadb else _MYSQL8_WAITS)
        for waiter, blocker, kind, mode, table, index, waited in cursor.fetchall():
            target = f"{table} ({index})" if index else table
            blockers, _, _ = found.setdefault(
                (int(waiter), str(kind), target), ([], mode, None if waited is None else float(waited))
            )
            if int(blocker) not in blockers:
                blockers.append(int(blocker))
        cursor.execute(_USER_LOCK_WAITS)
        for waiter, info, waited in cursor.fetchall():
            match = _GET_LOCK_NAME.search(info or "")
            name = match.group(1).replace("''", "'") if match else None
            holders: list[int] = []
            if name is not None:
                cursor.execute("SELECT IS_USED_LOCK(%s)", [name])
                row = cursor.fetchone()
                if row is not None and row[0] is not None:
                    holders.append(int(row[0]))
            found[(int(waiter), "user lock", name)] = (
                holders,
                "X",
                None if waited is None else float(waited),
            )
        cursor.execute(_METADATA_LOCK_WAITS)
        metadata_waits = cursor.fetchall()
        if metadata_waits:
            cursor.execute(_OPEN_TRANSACTIONS)
            open_transactions = sorted({int(row[0]) for row in cursor.fetchall()})
            for waiter, info, waited in metadata_waits:
                candidates = [pid for pid in open_transactions if pid != int(waiter)]
                table = _DDL_TABLE.match(info or "")
                found[(int(waiter), "metadata lock", table.group(1) if table else None)] = (
                    candidates,
                    None,
                    None if waited is None else float(waited),
                )
        pids = sorted(
            {pid for (waiter, _, _), (blockers, _, _) in found.items() for pid in (waiter, *blockers)}
        )
        sessions = _sessions(cursor, pids)
    waits = []
    for (waiter, kind, target), (blockers, mode, waited) in sorted(
        found.items(), key=lambda item: item[0][0]
    ):
        waits.append(
            LockWait(
                alias=alias,
                waiting=sessions.get(waiter, Session(waiter)),
                blocking=tuple(
                    sessions.get(pid, Session(pid, state=OTHER_DATABASE)) for pid in sorted(blockers)
                ),
                lock_kind=kind,
                mode=mode,
                target=target,
                waited_seconds=waited,
            )
        )
    return waits


def session_database(connection: BaseDatabaseWrapper, pid: int) -> tuple[str | None, bool, bool]:
    """Say which database session ``pid`` is connected to (``information_schema.processlist``).

    Returns:
        Its database (``None``: no such session), whether that is this connection's database, and whether ``pid``
        is this connection's own session.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(db, ''), db <=> DATABASE(), id = CONNECTION_ID() FROM information_schema.processlist "
            "WHERE id = %s",
            [pid],
        )
        row = cursor.fetchone()
    if row is None:
        return None, False, False
    return str(row[0]), bool(row[1]), bool(row[2])


def session_ended(connection: BaseDatabaseWrapper, pid: int, own: int | None) -> bool | None:
    """Whether session ``pid`` is gone, or idle (``Sleep``) with no transaction open (``information_schema``).

    ``None`` when this connection's ``CONNECTION_ID()`` is not ``own`` (the id its driver reports): a proxy
    between, whose ids name no server session. The sessions of the connection's own user are always listed;
    another user's need the ``PROCESS`` privilege. See
    https://mariadb.com/kb/en/information-schema-processlist-table/ and
    https://mariadb.com/kb/en/information-schema-innodb_trx-table/.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CONNECTION_ID(), (SELECT command FROM information_schema.processlist WHERE id = %s), "
            "EXISTS (SELECT 1 FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = %s)",
            [pid, pid],
        )
        row = cursor.fetchone()
    assert row is not None
    if row[0] != own:
        return None
    return row[1] is None or (row[1] == "Sleep" and not row[2])


# Threads of the server itself, not of a client: replication (the primary's dump threads, a replica's I/O and SQL
# threads), the event scheduler and other daemons. https://mariadb.com/kb/en/thread-command-values/
_SERVER_COMMANDS = frozenset(
    {"Daemon", "Binlog Dump", "Binlog Dump GTID", "Slave_IO", "Slave_SQL", "Slave_worker", "Register Slave"}
)
_SERVER_USERS = frozenset({"system user", "event_scheduler"})


def signal_target(connection: BaseDatabaseWrapper, pid: int) -> SessionTarget | None:
    """Say what session ``pid`` is (``information_schema.processlist``): its database, its command and user.

    Without the ``PROCESS`` privilege the list holds the connection's own user's sessions only: another user's
    session is then ``None``, as if it did not exist.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT db, db <=> DATABASE(), id = CONNECTION_ID(), command, user "
            "FROM information_schema.processlist WHERE id = %s",
            [pid],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    command, user = str(row[3] or ""), str(row[4] or "")
    client = command not in _SERVER_COMMANDS and user not in _SERVER_USERS
    return SessionTarget(pid, row[0], bool(row[1]), bool(row[2]), command, client)


def signal(connection: BaseDatabaseWrapper, pid: int, *, terminate: bool) -> bool:
    """``KILL QUERY`` (or ``KILL CONNECTION``) session ``pid``; return whether it was sent.

    The caller has checked the session with ``signal_target`` (``KILL`` has no condition of its own).

    Raises:
        django.db.OperationalError: error 1095, the user may not kill that session (another user's, without
            ``CONNECTION ADMIN``/``SUPER``).
    """
    # The id is an int checked by the caller; mysqlclient sends it as a literal, never as text from outside.
    with connection.cursor() as cursor:
        cursor.execute("KILL CONNECTION %s" if terminate else "KILL QUERY %s", [pid])
    return True


__all__ = [
    "UNBOUNDED_WAIT",
    "acquire",
    "held",
    "holders",
    "lock_name",
    "lock_waits",
    "release",
    "session_database",
    "signal",
    "signal_target",
]


# InnoDB refreshes its information_schema lock tables only when they were not read for 100 ms
# (CACHE_MIN_IDLE_TIME_US in trx0i_s.cc): polling faster would read a stale snapshot forever.
_INNODB_MIN_POLL = 0.15

MARIADB = ContentionSQL(
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

MYSQL = ContentionSQL(
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
