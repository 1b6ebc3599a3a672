"""A connection inherited across ``fork()`` is never used, nor closed on its socket, by the child.

Prefork servers and task runners (gunicorn ``--preload``, Celery/RQ prefork, ``multiprocessing`` with ``fork``) fork
a process that may hold open database connections. Parent and child then share one socket, so one server session:
a query of the child can read the reply meant for the parent, and closing the connection in the child sends the
protocol's Terminate (PostgreSQL) or ``COM_QUIT`` (MariaDB/MySQL), which ends the parent's session.

In the child, right after the fork (``os.register_at_fork``), every connection Django holds for the forking thread
gets its socket replaced, at the file-descriptor level, by one whose peer is closed; the connection is then closed
through Django (its farewell goes to that dead socket, never to the server), so the child's next query connects
afresh. The parent's session is untouched. The driver's descriptor is read with its public ``fileno()`` (psycopg,
mysqlclient). Connections of the parent's other threads are unreachable from the child (Django keeps them per
thread); a child should not touch them. See https://docs.python.org/3/library/os.html#os.register_at_fork.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket

from django.db import connections

logger = logging.getLogger("lockkit")

_installed = False


def detach_inherited_connections() -> int:
    """Detach this thread's open connections from their (inherited) sockets and close them; return how many.

    Run in a forked child; safe anywhere else too (the connections simply reconnect on next use).
    """
    detached = 0
    for connection in connections.all(initialized_only=True):
        driver = connection.connection
        if driver is None:
            continue
        try:
            fd = int(driver.fileno())
        except Exception:  # no descriptor to speak of (SQLite), or already closed
            continue
        if fd < 0:
            continue
        _replace_with_dead_socket(fd)
        with contextlib.suppress(
            Exception
        ):  # the farewell fails on the dead socket: the connection is closed
            connection.close()
        detached += 1
    return detached


def _replace_with_dead_socket(fd: int) -> None:
    """Point ``fd`` at a socket whose peer is closed: writes fail (EPIPE), reads see the end, nothing leaves."""
    alive, gone = socket.socketpair()
    try:
        gone.close()
        os.dup2(alive.fileno(), fd)
    finally:
        alive.close()


def _after_fork_in_child() -> None:
    try:
        count = detach_inherited_connections()
    except Exception:  # never break the child's start
        logger.exception("lockkit: detaching the database connections inherited across fork() failed")
        return
    if count:
        logger.debug("lockkit: detached %d database connection(s) inherited across fork()", count)


def install() -> None:
    """Register the after-fork hook once per process (idempotent)."""
    global _installed
    if _installed or not hasattr(os, "register_at_fork"):
        return
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _installed = True
