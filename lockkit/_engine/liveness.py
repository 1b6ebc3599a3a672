"""Leaving Django's connection usable after it died, so that the next call reconnects.

A dead connection is discarded before an outermost scope or a claims call, and after such a call lost it; a
connection on which such a call met a read-only server is discarded too (a failover left it on the old writer).
An idle psycopg 3 connection whose server ended the session (a restart, a terminated backend, an idle timeout)
is found by its farewell waiting on the socket, before anything of the next call is sent into it.

Django itself discards a dead connection only at request boundaries (``close_old_connections()``) or when an
``atomic()`` block fails; a worker loop is in neither place. This does what ``close_if_unusable_or_obsolete()``
does, for one alias, never inside a transaction someone else began. See
https://docs.djangoproject.com/en/stable/ref/databases/#persistent-connections.
"""

from __future__ import annotations

import contextlib
import select
import weakref
from typing import Any

from django.db import Error, connections

from lockkit.backends import backend_for
from lockkit.errors import ReadOnlyDatabase

try:
    import psycopg
    from psycopg import pq
except ImportError:  # pragma: no cover - psycopg2-only installations
    psycopg = None  # type: ignore[assignment]

# lockkit's own record of the driver connection each Django connection was last found usable on, after Django
# recorded an error on it: ``errors_occurred`` is read, never written. The driver object itself is kept (not its
# ``id()``, which a later driver connection may be given once this one is freed; not a weak reference, which
# ``sqlite3`` connections do not take): compared by identity, a new connection is never taken for a checked one.
_checked: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _outside_transaction(connection: Any) -> bool:
    # Read the flags, not get_autocommit(): that would connect.
    return not connection.in_atomic_block and bool(connection.autocommit)


def discard_if_dead(alias: str) -> None:
    """Close the alias's connection if it is no longer usable (outside transactions only).

    An idle psycopg 3 connection is closed when its server ended the session (``ended_while_idle``: one
    non-blocking ``poll()`` on the healthy path). Any connection is checked once Django recorded an error on it:
    the backend reads the driver's state (PostgreSQL) or pings (``is_usable()``, other vendors), once per driver
    connection (lockkit's own record: Django's ``errors_occurred`` is only read).
    """
    connection = connections[alias]
    driver = connection.connection
    if driver is None or connection.in_atomic_block:
        return
    if not connection.autocommit:
        # Autocommit off outside any atomic(): a transaction someone else began, or an atomic() whose end could
        # not turn autocommit back on over a dead connection (Django's exit raised). Closed only when dead, as
        # Django's close_if_unusable_or_obsolete() would: its transaction is gone with it. Left as it is, the
        # next atomic() would take it for the caller's own transaction and never reconnect.
        if connection.errors_occurred and backend_for(connection).tx.connection_unusable(connection):
            _close(alias)
        return
    if (
        psycopg is not None
        and isinstance(driver, psycopg.Connection)
        and (driver.closed or driver.info.transaction_status == pq.TransactionStatus.IDLE)
        and ended_while_idle(driver)
    ):
        _close(alias)
        return
    if not connection.errors_occurred:
        return
    if _checked.get(connection) is driver:
        return  # already found usable since Django recorded the error (Django's flag is Django's to reset)
    if backend_for(connection).tx.connection_unusable(connection):
        _close(alias)
    else:
        _checked[connection] = driver


def ended_while_idle(raw: Any) -> bool:
    """Whether the server ended an idle psycopg 3 connection: its farewell, or the end of the stream, is waiting.

    An idle session in autocommit is sent nothing unasked but notifications, notices and parameter changes. A
    server that ends the session sends an error of severity ``FATAL`` and then closes the socket; the two may
    arrive apart. A readable socket is read (``PQconsumeInput``) and parsed (``PQisBusy``), both through psycopg's
    documented ``pgconn``: libpq hands an error that arrives while idle to the notice handlers, where a handler of
    lockkit's, added for the read and removed after (``add_notice_handler()``), sees it; libpq marks the
    connection bad on the end of the stream. Either way the server ended the session before this call sent
    anything. One non-blocking ``poll()`` on the healthy path. See
    https://www.postgresql.org/docs/current/libpq-notice-processing.html and
    https://www.psycopg.org/psycopg3/docs/api/connections.html#psycopg.Connection.add_notice_handler.
    """
    if raw.closed or raw.broken:
        return True
    waiting = select.poll()
    waiting.register(raw.fileno(), select.POLLIN)
    if not waiting.poll(0):
        return False
    farewells: list[Any] = []

    def heard(diagnostic: Any) -> None:
        if diagnostic.severity_nonlocalized in ("FATAL", "PANIC"):
            farewells.append(diagnostic)

    raw.add_notice_handler(heard)
    try:
        for _ in range(_FAREWELL_READS):
            try:
                raw.pgconn.consume_input()
            except psycopg.OperationalError:
                return True
            if raw.pgconn.status == pq.ConnStatus.BAD:
                return True
            raw.pgconn.is_busy()  # parses what was read: an error sent while idle reaches ``heard``
            if farewells:
                return True
            if not waiting.poll(0):
                return False
        return False
    finally:
        raw.remove_notice_handler(heard)


#: How many times an idle connection's waiting input is read before it is taken as alive (notifications).
_FAREWELL_READS = 4


def discard_after_loss(alias: str) -> None:
    """Close the alias's connection after lockkit classified a ``ConnectionLost`` on it (outside ``atomic()``).

    Also when autocommit is still off: an ``atomic()`` whose exit could not turn it back on over the dead
    connection leaves it so, and any transaction on that connection is gone with it.
    """
    if not connections[alias].in_atomic_block:
        _close(alias)


def discard_read_only(alias: str, error: ReadOnlyDatabase, *, reused: bool) -> None:
    """Close the alias's connection after a ``ReadOnlyDatabase`` on it (outside transactions): the next call reconnects.

    A kept connection may be on a node that became read-only (a failover) while a new one reaches the writer.
    Marks ``error.stale`` when the connection was ``reused`` (open before the attempt) and was closed.
    """
    if _outside_transaction(connections[alias]):
        _close(alias)
        error.stale = reused


def _close(alias: str) -> None:
    # Closing a dead connection may itself report the failure; it is closed all the same (Django's close()
    # drops the driver connection in a finally block).
    with contextlib.suppress(Error):
        connections[alias].close()
