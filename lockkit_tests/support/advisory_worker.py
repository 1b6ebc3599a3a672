"""Entry point for a process that holds a session-level advisory lock until it is killed (``spawn`` method)."""

from __future__ import annotations

from multiprocessing.connection import Connection

from lockkit_tests.support.claim_worker import setup_django


def hold_session_lock(database_names: dict[str, str], pipe: Connection, alias: str, key: str) -> None:
    """Take ``key`` with ``session=True`` on ``alias``, send the holding session's id, wait (at most 120 s)."""
    setup_django(database_names)
    import lockkit

    with lockkit.advisory_lock(key, using=alias, session=True, lock_timeout=30) as held:
        pipe.send(held.pid)
        pipe.poll(120)  # the parent kills this process with SIGKILL long before
