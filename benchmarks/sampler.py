"""Lock waits as the database sees them: how many sessions wait on a lock, sampled every few milliseconds.

The same measure applies to Django processes and to pgbench, since it reads ``pg_stat_activity``, not the client.
"""

from __future__ import annotations

import threading
import time

from django.db import connections

INTERVAL = 0.01


class LockWaitSampler:
    """A background thread counting this database's sessions with ``wait_event_type = 'Lock'``."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lkbench-lock-sampler", daemon=True)

    def __enter__(self) -> LockWaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        try:
            with connections["default"].cursor() as cursor:
                while not self._stop.is_set():
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                    )
                    row = cursor.fetchone()
                    self.samples.append((time.time(), int(row[0]) if row else 0))
                    self._stop.wait(INTERVAL)
        finally:
            connections.close_all()

    def mean_waiting(self, start: float, end: float) -> float:
        """The mean number of sessions waiting on a lock between ``start`` and ``end`` (epoch seconds)."""
        inside = [n for t, n in self.samples if start <= t <= end]
        return sum(inside) / len(inside) if inside else 0.0
