"""``LockWaitMonitor``: a background thread sampling the database's own view of which sessions wait for a lock.

For tests that assert "nobody waited" (SKIP LOCKED claims), benchmarks that report how many sessions queued,
and demos that show it live. PostgreSQL: ``pg_locks``; MariaDB: ``information_schema.innodb_lock_waits``;
MySQL 8: ``performance_schema.data_lock_waits``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

from django.db import DEFAULT_DB_ALIAS, connections

from lockkit.backends import backend_for
from lockkit.scopes.aliases import check_alias
from lockkit.validation import duration

# How long ``stop()`` waits for the sampling thread to finish its current read.
_STOP_SECONDS = 10.0


@dataclass(frozen=True)
class LockWait:
    """One lock request the database reported as not granted.

    Attributes:
        waiting: The waiting session's id (``backend_pid()`` of its connection).
        kind: The kind of lock waited for: PostgreSQL's ``pg_locks.locktype`` (a row lock wait is
            ``"transactionid"`` or ``"tuple"``; ``"extend"`` is a table being extended), InnoDB's ``"RECORD"`` or
            ``"TABLE"``.
        holder: The session holding the conflicting lock, or ``None`` when the database did not say.
    """

    waiting: int
    kind: str
    holder: int | None


@dataclass(frozen=True)
class Sample:
    """One read of the lock-wait view.

    Attributes:
        at: When it was read, in seconds since the epoch (``time.time()``).
        waits: The lock waits it showed (one per waiting session and holder).
    """

    at: float
    waits: tuple[LockWait, ...]

    @property
    def waiting(self) -> int:
        """How many distinct sessions were waiting."""
        return len({wait.waiting for wait in self.waits})


@dataclass(eq=False)
class LockWaitMonitor:
    """Sample the lock waits of the current database's sessions from a thread of its own, until stopped.

    Use it as a context manager (``with LockWaitMonitor() as monitor: ...``) or call ``start()``/``stop()``.
    It reads over its own connection, leaves its own session out, and re-raises on ``stop()`` whatever the
    sampling thread raised, so a broken monitor fails the test instead of reporting "no waits". See
    https://www.postgresql.org/docs/current/view-pg-locks.html.

    Args:
        using: The database alias to watch (default ``"default"``).
        interval: Seconds between two reads; raised to 0.15 on MariaDB/MySQL, whose InnoDB lock tables are a
            cache refreshed only after 100 ms without a read.

    Attributes:
        samples (list[Sample]): Every read, in order (appended to while the monitor runs).

    Raises:
        TypeError, ValueError: ``using`` is not a configured alias, ``interval`` is not positive seconds.
        NotImplementedError: on ``start()``, the database is neither PostgreSQL nor MariaDB/MySQL.
    """

    using: str = DEFAULT_DB_ALIAS
    interval: float = 0.01
    samples: list[Sample] = field(default_factory=list, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _error: BaseException | None = field(default=None, init=False, repr=False)
    _ready: threading.Event = field(default_factory=threading.Event, init=False, repr=False)

    def __post_init__(self) -> None:
        """Check the alias and the interval before any thread starts."""
        check_alias(self.using, "using")
        self.interval = duration(self.interval, "interval")

    # -- what it saw -----------------------------------------------------------------------------------------

    @property
    def polls(self) -> int:
        """How many times it read the lock-wait view."""
        return len(self.samples)

    @property
    def waits(self) -> list[LockWait]:
        """Every lock wait seen, sample after sample (a long wait appears once per sample)."""
        return [wait for sample in list(self.samples) for wait in sample.waits]

    def waiting_sessions(self) -> set[int]:
        """The ids of every session seen waiting at least once."""
        return {wait.waiting for wait in self.waits}

    def peak(self) -> int:
        """The largest number of sessions seen waiting at once."""
        return max((sample.waiting for sample in list(self.samples)), default=0)

    def mean_waiting(self, start: float | None = None, end: float | None = None) -> float:
        """The mean number of sessions waiting per sample; 0.0 without a sample.

        Args:
            start: Only samples read at or after this time (seconds since the epoch, ``time.time()``); default all.
            end: Only samples read at or before this time; default all.
        """
        inside = [
            sample.waiting
            for sample in list(self.samples)
            if (start is None or sample.at >= start) and (end is None or sample.at <= end)
        ]
        return sum(inside) / len(inside) if inside else 0.0

    # -- running ---------------------------------------------------------------------------------------------

    def start(self) -> LockWaitMonitor:
        """Start sampling; return once the monitor's connection is open and its first read is done.

        Raises:
            RuntimeError: it was already started.
            NotImplementedError: the database is neither PostgreSQL nor MariaDB/MySQL.
            Exception: whatever the first read raised (a connection failure...), raised again here.
        """
        if self._thread is not None:
            raise RuntimeError("a LockWaitMonitor can be started only once")
        self._thread = threading.Thread(
            target=self._run, name=f"lockkit-lock-monitor-{self.using}", daemon=True
        )
        self._thread.start()
        self._ready.wait(_STOP_SECONDS)
        if self._error is not None:
            self._thread.join(_STOP_SECONDS)
            raise self._error
        return self

    def stop(self) -> None:
        """Stop sampling and wait for the thread; idempotent.

        Raises:
            RuntimeError: the thread did not stop within 10 seconds.
            Exception: whatever the sampling thread raised while it ran, raised again here.
        """
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join(_STOP_SECONDS)
        if self._thread.is_alive():
            raise RuntimeError(
                f"the lock-wait monitor on {self.using!r} did not stop within {_STOP_SECONDS}s"
            )
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> LockWaitMonitor:
        """Start sampling; return the monitor."""
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop sampling; re-raise the sampling thread's error, or attach it to the block's own as a note."""
        if exc is None:
            self.stop()
            return
        try:
            self.stop()
        except Exception as stop_error:
            # The block's own exception is the one to report; the monitor's becomes a note on it.
            exc.add_note(f"the lock-wait monitor also failed: {stop_error!r}")

    def _run(self) -> None:
        connection = connections.create_connection(self.using)
        try:
            dialect = backend_for(connection).sessions.contention_sql(connection)
            pause = max(self.interval, dialect.min_poll)
            with connection.cursor() as cursor:
                while True:
                    cursor.execute(dialect.lock_waits)
                    rows = cursor.fetchall()
                    waits = tuple(
                        LockWait(int(w), str(kind), None if h is None else int(h)) for w, kind, h in rows
                    )
                    self.samples.append(Sample(time.time(), waits))
                    self._ready.set()
                    if self._stop.wait(pause):
                        break
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()
            connection.close()


__all__ = ["LockWait", "LockWaitMonitor", "Sample"]
