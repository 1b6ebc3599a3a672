"""Ending another session, or cancelling its statement, from a separate connection of the same alias.

PostgreSQL: ``pg_terminate_backend(pid, timeout)`` (waits until the session is gone) and ``pg_cancel_backend``;
MariaDB/MySQL: ``KILL CONNECTION`` and ``KILL QUERY``. The session id is an int passed as a parameter. See
https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADMIN-SIGNAL and
https://mariadb.com/kb/en/kill/.
"""

from __future__ import annotations

from django.db import connections

from lockkit.testing.sessions import open_session_id

# Milliseconds pg_terminate_backend waits for the session to exit (an int of ours, passed as a parameter).
_TERMINATE_WAIT_MS = 5000

_TERMINATE = {"postgresql": "SELECT pg_terminate_backend(%s, %s)", "mysql": "KILL CONNECTION %s"}
_CANCEL = {"postgresql": "SELECT pg_cancel_backend(%s)", "mysql": "KILL QUERY %s"}


def session_of(using: str) -> int:
    """The session id of this thread's open connection to ``using`` (read from the driver, no query).

    Raises:
        RuntimeError: the connection is not open.
    """
    pid = open_session_id(connections[using])
    if pid is None:
        raise RuntimeError(f"the connection to {using!r} is not open")
    return pid


def _signal(using: str, statements: dict[str, str], pid: int, *extra: int) -> bool:
    control = connections.create_connection(using)
    try:
        sql = statements[control.vendor]
        with control.cursor() as cursor:
            if control.vendor == "postgresql":
                cursor.execute(sql, [pid, *extra])
                row = cursor.fetchone()
                return bool(row and row[0])
            cursor.execute(sql, [pid])
            return True
    finally:
        control.close()


def terminate(using: str, pid: int) -> bool:
    """End session ``pid`` of ``using``'s server and wait until it is gone; whether it existed."""
    return _signal(using, _TERMINATE, pid, _TERMINATE_WAIT_MS)


def cancel(using: str, pid: int) -> bool:
    """Cancel the statement session ``pid`` is running (the session stays); whether it was signalled."""
    return _signal(using, _CANCEL, pid)
