"""PostgreSQL advisory locks, lock-wait inspection and cancelling sessions: the SQL, in one place.

https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADVISORY-LOCKS,
https://www.postgresql.org/docs/current/view-pg-locks.html and
https://www.postgresql.org/docs/current/functions-info.html (``pg_blocking_pids``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockkit.backends.base import ContentionSQL
from lockkit.backends.waits import OTHER_DATABASE, LockWait, Session, SessionTarget

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from lockkit.advisory.keys import AdvisoryKey
    from lockkit.tablemodes import TableLockMode


def _function(*, session: bool, shared: bool, try_only: bool) -> str:
    # One of the twelve built-in function names; never user input.
    name = "pg_try_advisory" if try_only else "pg_advisory"
    name += "_lock" if session else "_xact_lock"
    return name + ("_shared" if shared else "")


def _arguments(key: AdvisoryKey) -> tuple[str, list[int]]:
    # Parenthesised: Django binds parameters client-side, so -9223372036854775808 arrives as a literal, and
    # "::" binds tighter than unary minus: -9223372036854775808::bigint overflows, (-9223372036854775808)::bigint
    # does not.
    if key.pair is not None:
        return "(%s)::integer, (%s)::integer", list(key.pair)
    return "(%s)::bigint", [key.value]


# Whether this server session already holds the key, in any mode (PostgreSQL's advisory locks are re-entrant: it
# would be granted again). An uncorrelated subquery: evaluated before the CASE may call the locking function.
_HELD_HERE = """
EXISTS (SELECT 1 FROM pg_locks
        WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND classid::bigint = %s AND objid::bigint = %s AND objsubid = %s)
"""


def acquire(
    connection: BaseDatabaseWrapper,
    key: AdvisoryKey,
    *,
    shared: bool,
    session: bool,
    nowait: bool,
    unless_held: bool = False,
) -> tuple[bool | None, int]:
    """Take the lock; return whether it was granted and the session's backend pid.

    Waits obey the transaction's ``lock_timeout`` (an expired wait raises SQLSTATE 55P03); with ``nowait`` the
    ``pg_try_`` form returns at once. With ``unless_held``, the same statement first looks in ``pg_locks`` for a
    hold of the key by this server session and, if there is one, takes nothing and returns ``None``.
    """
    placeholders, params = _arguments(key)
    function = _function(session=session, shared=shared, try_only=nowait)
    # The waiting forms return void: "IS NOT NULL" makes them true once granted.
    call = f"{function}({placeholders})" + ("" if nowait else " IS NOT NULL")
    if unless_held:
        sql = f"SELECT CASE WHEN {_HELD_HERE} THEN NULL ELSE {call} END, pg_backend_pid()"
        params = [*_lock_id(key), *params]
    else:
        sql = f"SELECT {call}, pg_backend_pid()"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    assert row is not None
    return (None if row[0] is None else bool(row[0])), int(row[1])


def release(connection: BaseDatabaseWrapper, key: AdvisoryKey, *, shared: bool) -> tuple[bool, int]:
    """Release one hold of a session-level lock; return whether this session held it, and its backend pid."""
    placeholders, params = _arguments(key)
    function = "pg_advisory_unlock_shared" if shared else "pg_advisory_unlock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}({placeholders}), pg_backend_pid()", params)
        row = cursor.fetchone()
    assert row is not None
    return bool(row[0]), int(row[1])


# The sessions holding an advisory key in this database, as pg_locks shows it: a bigint key is (classid, objid) =
# (high, low) 32 bits with objsubid 1, the two-key form (first, second) with objsubid 2; oids are unsigned. Only an
# exclusive hold excludes a shared request. Reading pg_locks takes no heavyweight lock: it cannot wait.
_HOLDERS = """
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND pid IS NOT NULL AND pid <> pg_backend_pid()
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid::bigint = %s AND objid::bigint = %s AND objsubid = %s AND (NOT %s OR mode = 'ExclusiveLock')
ORDER BY pid
"""


def _lock_id(key: AdvisoryKey) -> tuple[int, int, int]:
    """``(classid, objid, objsubid)``: how ``pg_locks`` shows the key."""
    if key.pair is not None:
        return key.pair[0] & 0xFFFF_FFFF, key.pair[1] & 0xFFFF_FFFF, 2
    unsigned = key.value & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF, 1


def _in_failed_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether the driver says the connection's transaction has failed (psycopg 3 and psycopg2, public API)."""
    raw = connection.connection
    if raw is None:
        return True
    info = getattr(raw, "info", None)
    status = getattr(info, "transaction_status", None)  # psycopg 3: pq.TransactionStatus
    if status is None and callable(getattr(raw, "get_transaction_status", None)):
        status = raw.get_transaction_status()  # psycopg2: an int
    # INERROR is 3 in both drivers (libpq's PQTRANS_INERROR), UNKNOWN 4: a broken connection.
    return status is None or int(status) >= 3


def holders(connection: BaseDatabaseWrapper, key: AdvisoryKey, *, shared: bool) -> tuple[int, ...] | None:
    """The other sessions holding ``key`` (exclusively, for a ``shared`` request), or ``None`` in a failed transaction."""
    if _in_failed_transaction(connection):
        return None
    with connection.cursor() as cursor:
        cursor.execute(_HOLDERS, [*_lock_id(key), shared])
        return tuple(int(row[0]) for row in cursor.fetchall())


# The sessions of this database waiting for a lock: exactly one ungranted pg_locks row each. A row-lock waiter
# waits on the holder's transaction id, after taking the tuple lock: that tuple lock names the relation.
_WAITS = """
SELECT a.pid, a.application_name, a.usename, a.query, a.state,
       EXTRACT(EPOCH FROM clock_timestamp() - a.xact_start)::float8,
       pg_blocking_pids(a.pid),
       l.locktype, l.mode,
       COALESCE(l.relation, (SELECT t.relation FROM pg_locks t
                             WHERE t.pid = a.pid AND t.locktype = 'tuple' AND t.granted LIMIT 1))::regclass::text,
       l.classid::bigint, l.objid::bigint, l.objsubid, l.transactionid::text, l.page, l.tuple,
       EXTRACT(EPOCH FROM clock_timestamp() - COALESCE(l.waitstart, a.state_change))::float8
FROM pg_stat_activity AS a
JOIN pg_locks AS l ON l.pid = a.pid AND NOT l.granted
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
ORDER BY a.pid
"""

# The blockers, of this database only: a session of another database (which can block this one's sessions on a
# shared catalog) is named by its pid alone, never with its query, user or application.
_SESSIONS = """
SELECT pid, application_name, usename, query, state,
       EXTRACT(EPOCH FROM clock_timestamp() - xact_start)::float8
FROM pg_stat_activity WHERE pid = ANY(%s) AND datname = current_database()
"""


def _elsewhere(pid: int) -> Session:
    """A blocker that is not a session of this database (another database's, or one that has just ended)."""
    return Session(pid, state=OTHER_DATABASE)


def _int32(value: int) -> int:
    return value - 2**32 if value >= 2**31 else value


def _target(row: Any) -> str | None:
    locktype, relation, classid, objid, objsubid, xid, page, tuple_ = (
        row[7],
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
        row[14],
        row[15],
    )
    if locktype == "advisory" and classid is not None and objid is not None:
        if objsubid == 2:
            return f"advisory key ({_int32(classid)}, {_int32(objid)})"
        value = int.from_bytes(((classid << 32) | objid).to_bytes(8, "big"), "big", signed=True)
        return f"advisory key {value}"
    if locktype == "tuple" and relation is not None:
        return f"{relation} (page {page}, tuple {tuple_})"
    if locktype == "transactionid":
        return (
            f"{relation}: a row written or locked by transaction {xid}" if relation else f"transaction {xid}"
        )
    return str(relation) if relation is not None else None


def lock_waits(connection: BaseDatabaseWrapper, alias: str) -> list[LockWait]:
    """Return the lock waits of the connection's database, without chains (``lockkit.inspection`` adds them)."""
    with connection.cursor() as cursor:
        cursor.execute(_WAITS)
        rows = cursor.fetchall()
        blocker_pids = sorted({int(pid) for row in rows for pid in row[6]})
        sessions = {}
        if blocker_pids:
            cursor.execute(_SESSIONS, [blocker_pids])
            sessions = {
                int(r[0]): Session(int(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in cursor.fetchall()
            }
    waits = []
    for row in rows:
        waiting = Session(int(row[0]), row[1], row[2], row[3], row[4], row[5])
        blocking = tuple(sessions.get(int(pid), _elsewhere(int(pid))) for pid in row[6])
        waits.append(
            LockWait(
                alias=alias,
                waiting=waiting,
                blocking=blocking,
                lock_kind=str(row[7]),
                mode=row[8],
                target=_target(row),
                waited_seconds=row[16],
            )
        )
    return waits


def session_database(connection: BaseDatabaseWrapper, pid: int) -> tuple[str | None, bool, bool]:
    """Say which database session ``pid`` is connected to (``pg_stat_activity``).

    Returns:
        Its database (``None``: no such session), whether that is this connection's database, and whether ``pid``
        is this connection's own session.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT datname, datname = current_database(), pid = pg_backend_pid() FROM pg_stat_activity "
            "WHERE pid = %s",
            [pid],
        )
        row = cursor.fetchone()
    if row is None:
        return None, False, False
    return row[0], bool(row[1]), bool(row[2])


def signal_target(connection: BaseDatabaseWrapper, pid: int) -> SessionTarget | None:
    """Say what session ``pid`` is (``pg_stat_activity``): its database and its ``backend_type``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT datname, datname IS NOT DISTINCT FROM current_database(), pid = pg_backend_pid(), "
            "backend_type FROM pg_stat_activity WHERE pid = %s",
            [pid],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    # backend_type is NULL for another role's session unless this role has pg_read_all_stats (or is a member).
    kind = row[3] or ""
    return SessionTarget(pid, row[0], bool(row[1]), bool(row[2]), kind, kind == "client backend", bool(kind))


def signal(connection: BaseDatabaseWrapper, pid: int, *, terminate: bool) -> bool:
    """Cancel the statement of (or terminate) session ``pid``; return whether the signal was sent.

    The statement signals only a client backend of this database, whatever the caller checked before: a pid
    reused meanwhile by a walsender or a background worker is left alone (``False``).

    Raises:
        django.db.ProgrammingError: SQLSTATE 42501, the role may not signal that session (a superuser's, or
            another role's without ``pg_signal_backend``).
    """
    function = "pg_terminate_backend" if terminate else "pg_cancel_backend"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {function}(pid) FROM pg_stat_activity "
            "WHERE pid = %s AND backend_type = 'client backend' AND datname = current_database() "
            "AND pid <> pg_backend_pid()",
            [pid],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def lock_tables(
    connection: BaseDatabaseWrapper, tables: list[str], mode: TableLockMode, *, nowait: bool
) -> None:
    """``LOCK TABLE <tables> IN <mode> MODE [NOWAIT]`` in the caller's transaction, until it ends.

    ``tables`` are names the caller quoted with ``ops.quote_name``; ``mode`` is one of the eight mode names (a
    validated ``TableLockMode``, never user text). See https://www.postgresql.org/docs/current/sql-lock.html.
    """
    suffix = " NOWAIT" if nowait else ""
    with connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {', '.join(tables)} IN {mode.value} MODE{suffix}")


# The client sessions of this database blocking one session, once that session has waited long enough for its
# ungranted lock (pg_locks.waitstart, PostgreSQL 14+; NULL for an instant after the wait begins: not yet).
# Never a walsender, autovacuum or other background process: backend_type says which a session is.
_CLIENT_BLOCKERS = """
SELECT a.pid, a.application_name, a.usename, a.query, a.state,
       EXTRACT(EPOCH FROM clock_timestamp() - a.xact_start)::float8
FROM pg_stat_activity AS a
WHERE a.pid = ANY(pg_blocking_pids(%s))
  AND a.backend_type = 'client backend' AND a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND EXISTS (SELECT 1 FROM pg_locks AS l
              WHERE l.pid = %s AND NOT l.granted AND l.waitstart <= clock_timestamp() - make_interval(secs => %s))
ORDER BY a.pid
"""


def client_blockers(connection: BaseDatabaseWrapper, pid: int, *, waited: float) -> list[Session]:
    """The client sessions blocking ``pid`` once it has waited ``waited`` seconds for its lock; else none."""
    with connection.cursor() as cursor:
        cursor.execute(_CLIENT_BLOCKERS, [pid, pid, waited])
        rows = cursor.fetchall()
    return [Session(int(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in rows]


def session_pid(connection: BaseDatabaseWrapper) -> int:
    """This connection's backend pid."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


__all__ = [
    "acquire",
    "client_blockers",
    "holders",
    "lock_tables",
    "lock_waits",
    "release",
    "session_database",
    "session_pid",
    "signal",
    "signal_target",
]


#: The testing toolkit's SQL (``PostgreSQLSessions.contention_sql``).
POSTGRESQL = ContentionSQL(
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
