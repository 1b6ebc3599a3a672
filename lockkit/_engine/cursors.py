"""One Django cursor per thread and alias, used again by lockkit's frequent statements (enqueue, claims).

psycopg finds each parameter's dumper per cursor, so a new cursor per statement pays those lookups every time:
about 30 microseconds of a loopback ``enqueue()``'s 400. lockkit's own frequent statements take the cursor
``kept()`` returns instead. It is the cursor ``connection.cursor()`` made, kept while its driver connection and
Django's query logging stay the same; ``execute_wrapper()`` hooks and ``connection.queries`` see its statements as
they see any other. A use nested inside another (a hook that enqueues) gets a cursor of its own, closed after.
Only lockkit's record (a thread-local) is written; nothing of Django's or the driver's.

What ``connection.cursor()`` does before it makes a cursor is done on every use: the health check
(``CONN_HEALTH_CHECKS``), connecting, the thread-sharing check. A setting change (``USE_TZ``, ``TIME_ZONE``: Django
sets a cursor's time zone when it makes it) retires every kept cursor, and where the connection's ``cursor()`` is
not its class's own (Django's test cases put a guard there against queries on a database a test did not declare),
every use goes through it.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.signals import setting_changed

_local = threading.local()

#: Bumped by every ``setting_changed``: a cursor kept before the change is not used after it.
_settings = [0]


def _settings_changed(**kwargs: Any) -> None:
    _settings[0] += 1


setting_changed.connect(_settings_changed, dispatch_uid="lockkit._engine.cursors.settings_changed")


class _Kept:
    """A kept cursor; as a context manager, it is marked in use for the block (a nested use gets its own)."""

    __slots__ = ("busy", "cursor", "driver", "logged", "settings", "wrapper")

    def __init__(self, wrapper: Any, cursor: Any) -> None:
        self.wrapper = wrapper  # the Django connection (``DatabaseWrapper``) it belongs to
        self.cursor = cursor
        self.driver = wrapper.connection
        self.logged = wrapper.queries_logged
        self.settings = _settings[0]
        self.busy = False

    def fits(self, connection: Any) -> bool:
        return (
            self.wrapper is connection
            and self.driver is connection.connection
            and self.logged == connection.queries_logged
            and self.settings == _settings[0]
        )

    def __enter__(self) -> Any:
        self.busy = True
        return self.cursor

    def __exit__(self, *exc_info: object) -> None:
        self.busy = False


def kept(connection: Any) -> Any:
    """A context manager giving a cursor of ``connection`` (Django's ``CursorWrapper``) for a statement of lockkit's.

    ``with cursors.kept(connection) as cursor: cursor.execute(sql, params)``, as with ``connection.cursor()``.

    Raises:
        django.core.exceptions.SynchronousOnlyOperation: called from a running event loop (as ``cursor()``).
        django.db.DatabaseError: connecting failed (as ``cursor()``).
    """
    if getattr(connection.cursor, "__func__", None) is not getattr(type(connection), "cursor", None):
        # Replaced on this connection (a test case's guard), or not a connection itself (``django.db.connection``
        # is a proxy): every statement goes through ``cursor()``.
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    entries: dict[str, _Kept] = _local.__dict__.setdefault("entries", {})
    entry = entries.get(connection.alias)
    if entry is not None and entry.busy:
        return connection.cursor()  # nested inside a statement of the kept one: its own, closed after
    if entry is None or not entry.fits(connection):
        entry = entries[connection.alias] = _Kept(connection, connection.cursor())
    return entry
