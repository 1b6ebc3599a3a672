"""Waking idle workers on PostgreSQL: ``LISTEN`` on a dedicated connection for the ``NOTIFY`` sent by enqueues.

Elsewhere (MariaDB/MySQL, SQLite) there is nothing to listen to: idle workers poll every ``poll_interval``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from django.db import connections

logger = logging.getLogger("lockkit.tasks.worker")

#: The channel ``DatabaseBackend.enqueue`` notifies (payload: the queue name).
CHANNEL = "lockkit_tasks"
# How long one wait for notifications lasts: a stopping worker waits for its listener that long at most (a wait that
# ends with no notification costs a poll() and a few Python lines: ten a second per idle worker).
_WAIT = 0.1


class Wakeup:
    """A thread that sets ``wake`` when a ``NOTIFY`` for one of ``queues`` arrives (PostgreSQL only).

    ``queues`` ``None``: any queue but ``excluded``.

    Uses psycopg 3's ``Connection.notifies(timeout=..., stop_after=...)`` on a connection of its own, made by
    ``connections.create_connection(alias)`` (so with the alias's settings) and closed on ``stop()``. A lost
    connection is logged and reopened; meanwhile the worker still polls. See
    https://www.psycopg.org/psycopg3/docs/advanced/async.html#asynchronous-notifications.
    """

    def __init__(
        self, alias: str, queues: Sequence[str] | None, wake: threading.Event, *, excluded: Sequence[str] = ()
    ) -> None:
        """Prepare (nothing connects until ``start()``)."""
        self.alias = alias
        self.queues = None if queues is None else set(queues)
        self.excluded = set(excluded)
        self.wake = wake
        self.listening = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start listening, if the alias is PostgreSQL (else nothing)."""
        if connections[self.alias].vendor != "postgresql":
            return
        self._thread = threading.Thread(target=self._run, name="lockkit-tasks-listen", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and close the connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            wrapper: Any = connections.create_connection(self.alias)
            try:
                wrapper.ensure_connection()
                raw = wrapper.connection
                raw.execute(f"LISTEN {CHANNEL}")
                self.listening.set()
                # A NOTIFY sent while no session listened reached nobody (the connection was lost, or not yet
                # open): the worker looks for ready tasks once now, rather than after a whole poll_interval.
                self.wake.set()
                while not self._stop.is_set():
                    try:
                        notes = raw.notifies(timeout=_WAIT, stop_after=1)
                    except TypeError:
                        # psycopg < 3.2 has no notifies(timeout=): it would block until a notification, and
                        # a stopping worker could not end this thread. Poll instead.
                        logger.info(
                            "psycopg %s cannot wait for notifications with a timeout: polling", _version()
                        )
                        return
                    for note in notes:
                        if (
                            note.payload in self.queues
                            if self.queues is not None
                            else note.payload not in self.excluded
                        ):
                            self.wake.set()
            except Exception as failure:  # Django's DatabaseError, psycopg's own errors, OSError
                self.listening.clear()
                logger.warning("LISTEN %s failed (polling meanwhile): %s", CHANNEL, failure)
                self._stop.wait(1.0)
            finally:
                try:
                    wrapper.close()
                except Exception:  # already broken: nothing to close
                    logger.debug("closing the LISTEN connection failed", exc_info=True)


def _version() -> str:
    import psycopg

    return str(psycopg.__version__)
