"""The background thread both heartbeats run: a beat every interval, failures kept, its connections closed.

Shared by ``heartbeat_every`` (one claim) and ``worker_heartbeat`` (all of a worker's claims).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import DatabaseError, connections

logger = logging.getLogger("lockkit.claims")


class BeatThread:
    """A daemon thread calling ``beat()`` every ``every`` seconds until ``stop()`` or until ``beat()`` returns False.

    A ``DatabaseError`` from a beat is passed to ``on_failure`` and the thread's connection to ``alias`` is closed,
    so the next beat runs on a fresh one (a dropped connection, a lock timeout: the leases still have time). Any
    other exception is passed to ``on_crash`` and ends the thread (the owner must learn that nobody renews its
    leases any more). The thread closes its connections when it ends. See
    https://docs.djangoproject.com/en/stable/ref/databases/#connection-management.
    """

    def __init__(
        self,
        beat: Callable[[], bool],
        *,
        every: float,
        alias: str,
        name: str,
        first_at_once: bool,
        on_failure: Callable[[DatabaseError], None],
        on_crash: Callable[[BaseException], None],
    ) -> None:
        """Prepare the thread (``start()`` starts it)."""
        self._beat = beat
        self._every = every
        self._alias = alias
        self._first_at_once = first_at_once
        self._on_failure = on_failure
        self._on_crash = on_crash
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def start(self, owner: str) -> None:
        """Start the thread.

        Raises:
            RuntimeError: it was already started (``owner`` names the object, for the message).
        """
        if self._started:
            raise RuntimeError(f"a {owner} object can be entered once; make a new one")
        self._started = True
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop the thread, waiting up to ``timeout`` seconds for a beat in flight; whether it ended."""
        self._stop.set()
        if not self._started:
            return True
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            if self._first_at_once and not self._once():
                return
            while not self._stop.wait(self._every):
                if not self._once():
                    return
        except BaseException as unexpected:
            self._on_crash(unexpected)
            raise
        finally:
            connections.close_all()

    def _once(self) -> bool:
        try:
            return self._beat()
        except DatabaseError as failure:
            self._on_failure(failure)
            connections[self._alias].close()
            return True
