"""Server-side session ids, and cancelling the statement another thread's connection is running.

Django keeps one connection per thread per alias; these helpers name the database session behind one, and
reach it from another thread when a test must give up on it.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from lockkit.backends import backend_for
from lockkit.scopes.aliases import check_alias


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
        NotImplementedError: the database is neither PostgreSQL nor MariaDB/MySQL (SQLite: no server sessions).
    """
    connection = connections[check_alias(using)]
    sql = backend_for(connection).sessions.contention_sql(connection).session_id
    with connection.cursor() as cursor:
        cursor.execute(sql)
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def lock_wait_edges(alias: str) -> list[tuple[int, int]]:
    """``(waiting session, blocking session)`` pairs, one per direct lock wait on ``alias``, read just now.

    Asked over a fresh connection, outside any transaction of the caller.

    Raises:
        NotImplementedError: the database is neither PostgreSQL nor MariaDB/MySQL.
    """
    connection = connections.create_connection(alias)
    try:
        sql = backend_for(connection).sessions.contention_sql(connection).blocking_edges
        with connection.cursor() as cursor:
            cursor.execute(sql)
            return [(int(waiter), int(blocker)) for waiter, blocker in cursor.fetchall()]
    finally:
        connection.close()


def open_session_id(connection: BaseDatabaseWrapper) -> int | None:
    """Return the session id behind an open Django connection, read from the driver without a query.

    Call it from the connection's own thread: mysqlclient refuses calls on a connection that another thread is
    using. ``SessionTracker`` records it there, when the connection opens.
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


@dataclass
class _Opened:
    wrapper: BaseDatabaseWrapper
    raw: Any  # the driver connection the id belongs to; a reconnect replaces it
    pid: int


_tracked = threading.local()


def _record(sender: object, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    sessions: list[_Opened] | None = getattr(_tracked, "sessions", None)
    if sessions is None:
        return
    pid = open_session_id(connection)
    if pid is not None:
        sessions.append(_Opened(connection, connection.connection, pid))


connection_created.connect(_record, dispatch_uid="lockkit.testing.sessions.record")


class SessionTracker:
    """The database sessions one thread opens, recorded as they open, so that another thread can cancel them."""

    def __init__(self) -> None:
        """Start with no session recorded."""
        self._sessions: list[_Opened] = []

    def start(self) -> None:
        """Record the sessions the calling thread opens from now on."""
        _tracked.sessions = self._sessions

    def stop(self) -> None:
        """Stop recording in the calling thread."""
        _tracked.sessions = None

    def cancel_statements(self) -> list[int]:
        """Cancel whatever statement each still-open recorded session is running; return the sessions signalled.

        Used when a thread is stuck in the database past a test's timeout: cancelling lets it fail and close its
        connection, so the test database can still be dropped at teardown. The cancel request goes over a fresh
        connection of the same alias. Best effort: a session that has closed, or of another vendor, is skipped.
        """
        signalled: list[int] = []
        for opened in list(self._sessions):
            wrapper = opened.wrapper
            # Only a session still open on the same driver connection: a closed one's id may be reused.
            if wrapper.vendor not in ("postgresql", "mysql") or wrapper.connection is not opened.raw:
                continue
            control = connections.create_connection(wrapper.alias)
            # The session may end meanwhile: cancelling is best effort. The id is a parameter, never text.
            with contextlib.suppress(Exception):
                with control.cursor() as cursor:
                    cursor.execute(backend_for(control).sessions.contention_sql(control).cancel, [opened.pid])
                signalled.append(opened.pid)
            control.close()
        return signalled


__all__ = ["SessionTracker", "backend_pid", "open_session_id"]
