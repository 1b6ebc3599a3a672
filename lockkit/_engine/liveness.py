"""Leaving Django's connection usable after it died, so that the next call reconnects.

A dead connection is discarded before an outermost scope or a claims call, and after such a call lost it; a
connection on which such a call met a read-only server is discarded too (a failover left it on the old writer).

Django itself discards a dead connection only at request boundaries (``close_old_connections()``) or when an
``atomic()`` block fails; a worker loop is in neither place. This does what ``close_if_unusable_or_obsolete()``
does, for one alias, never inside a transaction someone else began. See
https://docs.djangoproject.com/en/stable/ref/databases/#persistent-connections.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from django.db import Error, connections

from lockkit.backends import backend_for
from lockkit.errors import ReadOnlyDatabase

# lockkit's own record of the driver connection each Django connection was last found usable on, after Django
# recorded an error on it: ``errors_occurred`` is read, never written. The driver object itself is kept (not its
# ``id()``, which a later driver connection may be given once this one is freed; not a weak reference, which
# ``sqlite3`` connections do not take): compared by identity, a new connection is never taken for a checked one.
_checked: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _outside_transaction(alias: str) -> bool:
    connection = connections[alias]
    # Read the flags, not get_autocommit(): that would connect.
    return not connection.in_atomic_block and bool(connection.autocommit)


def discard_if_dead(alias: str) -> None:
    """Close the alias's connection if Django saw it fail and it is no longer usable (outside transactions only).

    Free on the healthy path: nothing is checked unless Django recorded an error on the connection; then the
    backend reads the driver's state (PostgreSQL) or pings (``is_usable()``, other vendors), once per driver
    connection (lockkit's own record: Django's ``errors_occurred`` is only read).
    """
    connection = connections[alias]
    driver = connection.connection
    if driver is None or not connection.errors_occurred or not _outside_transaction(alias):
        return
    if _checked.get(connection) is driver:
        return  # already found usable since Django recorded the error (Django's flag is Django's to reset)
    if backend_for(connection).tx.connection_unusable(connection):
        _close(alias)
    else:
        _checked[connection] = driver


def discard_after_loss(alias: str) -> None:
    """Close the alias's connection after lockkit classified a ``ConnectionLost`` on it (outside transactions)."""
    if _outside_transaction(alias):
        _close(alias)


def discard_read_only(alias: str, error: ReadOnlyDatabase, *, reused: bool) -> None:
    """Close the alias's connection after a ``ReadOnlyDatabase`` on it (outside transactions): the next call reconnects.

    A kept connection may be on a node that became read-only (a failover) while a new one reaches the writer.
    Marks ``error.stale`` when the connection was ``reused`` (open before the attempt) and was closed.
    """
    if _outside_transaction(alias):
        _close(alias)
        error.stale = reused


def _close(alias: str) -> None:
    # Closing a dead connection may itself report the failure; it is closed all the same (Django's close()
    # drops the driver connection in a finally block).
    with contextlib.suppress(Error):
        connections[alias].close()
