"""Server-side session ids, and cancelling the statement another thread's connection is running.

Django keeps one connection per thread per alias; these helpers name the database session behind one, and
reach it from another thread when a test must give up on it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from lockkit.aliases import check_alias

_PID_SQL = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
# The session id is an int read from the driver, passed as a parameter, never formatted into the text.
_CANCEL_SQL = {"postgresql": "SELECT pg_cancel_backend(%s)", "mysql": "KILL QUERY %s"}


def backend_pid(using: str = DEFAULT_DB_ALIAS) -> int:
    """Return the server-side session id of this thread's connection to ``using``.

    That is the PostgreSQL backend pid (``pg_backend_pid()``) or the MariaDB/MySQL connection id
    (``CONNECTION_ID()``): the numbers ``pg_blocking_pids()`` and the InnoDB lock-wait tables report. See
    https://www.postgresql.org/docs/current/functions-info.html.

    Args:
        using: The database alias (default ``"default"``).

    Returns:
        The session id. It opens the thread's connection if it was not open yet.

    Raises:
        TypeError, ValueError: ``using`` is not a configured alias.
        NotImplementedError: the database is neither PostgreSQL nor MariaDB/MySQL.
    """
    connection = connections[check_alias(using)]
    sql = _PID_SQL.get(connection.vendor)
    if sql is None:
        raise NotImplementedError(f"backend_pid does not support {connection.vendor} ({using!r})")
    with connection.cursor() as cursor:
        cursor.execute(sql)
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def open_session_id(connection: BaseDatabaseWrapper) -> int | None:
    """Return the session id behind a Django connection object if it is open, without running a query.

    Safe to call from another thread than the connection's: it only reads attributes of the driver connection.
    """
    raw: Any = connection.connection
    if raw is None:
        return None
    info = getattr(raw, "info", None)
    if info is not None and hasattr(info, "backend_pid"):  # psycopg 3
        return int(info.backend_pid)
    for name in ("get_backend_pid", "thread_id"):  # psycopg2, mysqlclient
        method = getattr(raw, name, None)
        if callable(method):
            return int(method())
    return None


def cancel_statements(wrappers: list[BaseDatabaseWrapper]) -> list[int]:
    """Cancel whatever statement each open connection in ``wrappers`` is running; return the sessions
    signalled.

    Used when a thread is stuck in the database past a test's timeout: cancelling lets it fail and close its
    connection, so the test database can still be dropped at teardown. The cancel request goes over a fresh
    connection of the same alias. Best effort: a connection that is closed or of another vendor is left alone.
    """
    signalled: list[int] = []
    for wrapper in wrappers:
        pid = open_session_id(wrapper)
        sql = _CANCEL_SQL.get(wrapper.vendor)
        if pid is None or sql is None:
            continue
        control = connections.create_connection(wrapper.alias)
        # The session may have ended meanwhile: cancelling is best effort.
        with contextlib.suppress(Exception):
            with control.cursor() as cursor:
                cursor.execute(sql, [pid])
            signalled.append(pid)
        control.close()
    return signalled


__all__ = ["backend_pid", "cancel_statements", "open_session_id"]
