"""Test helpers: a session that holds a row locked while it changes it, until the test lets it commit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connections, transaction

from lockkit.testing import ContentionTimeout, backend_pid

TIMEOUT = 10.0


@dataclass
class Writer:
    """A transaction in another thread that has run ``change`` and waits for ``commit`` before committing."""

    pid: int = 0
    ready: threading.Event = field(default_factory=threading.Event)
    commit: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)


@contextmanager
def uncommitted(change: Callable[[], object]) -> Iterator[Writer]:
    """Run ``change`` in a transaction on another connection; it commits when the block exits."""
    writer = Writer()

    def run() -> None:
        try:
            with transaction.atomic():
                writer.pid = backend_pid()
                change()
                writer.ready.set()
                if not writer.commit.wait(TIMEOUT):
                    raise ContentionTimeout("the test never let the writer commit")
        except BaseException as exc:
            writer.errors.append(exc)
        finally:
            writer.ready.set()
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        if not writer.ready.wait(TIMEOUT):
            raise ContentionTimeout("the writer did not start")
        if writer.errors:
            raise writer.errors[0]
        yield writer
    finally:
        writer.commit.set()
        thread.join(TIMEOUT)
    assert not thread.is_alive(), "the writer did not finish"
    if writer.errors:
        raise writer.errors[0]


def start(func: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``func`` in a thread with its own connection; the list receives its result or exception."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(func())
        except BaseException as exc:
            out.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def finish(thread: threading.Thread, out: list[object]) -> object:
    """Join a ``start``ed thread (with a timeout) and return its result or exception."""
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "the contender did not finish"
    assert len(out) == 1
    return out[0]


_WAITING_BEHIND_SQL = """
WITH RECURSIVE waiting(pid) AS (
    SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))
    UNION
    SELECT a.pid FROM pg_stat_activity a JOIN waiting w ON w.pid = ANY(pg_blocking_pids(a.pid))
)
SELECT count(*) FROM waiting
"""


def wait_until_queued(holder_pid: int, count: int, *, timeout: float = TIMEOUT) -> None:
    """Return once ``count`` sessions wait, directly or in the queue behind another waiter, on ``holder_pid``.

    ``lockkit.testing.wait_until_blocked(holder, count=2)`` is not enough when two sessions wait for one row:
    PostgreSQL queues the second behind the first waiter's tuple lock, so ``pg_blocking_pids()`` of the second
    names the first waiter, not the holder. This follows the chain.
    """
    connection = connections.create_connection("default")
    deadline = time.monotonic() + timeout
    try:
        with connection.cursor() as cursor:
            while True:
                cursor.execute(_WAITING_BEHIND_SQL, [holder_pid])
                row = cursor.fetchone()
                if row is not None and row[0] >= count:
                    return
                if time.monotonic() >= deadline:
                    raise ContentionTimeout(
                        f"fewer than {count} sessions queued behind {holder_pid} after {timeout}s"
                    )
                time.sleep(0.005)
    finally:
        connection.close()
