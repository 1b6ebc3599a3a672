"""``lockkit.prioritize``: a block whose lock waits end the sessions blocking it, after a grace period.

A watcher thread, on a connection of its own, polls who blocks the caller's session (``pg_blocking_pids``) and
terminates (or cancels) those blockers through ``lockkit.inspection``; it stops when the block exits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from django.db import DEFAULT_DB_ALIAS, connections

from lockkit import inspection
from lockkit.backends import backend_for
from lockkit.backends.waits import Session
from lockkit.scopes.aliases import check_alias
from lockkit.validation import Duration, duration

logger = logging.getLogger("lockkit.priority")

#: The shortest ``interval`` accepted, in seconds: each poll is a query on the server.
MIN_INTERVAL = 0.01
# How long the block's exit waits for the watcher beyond one poll (a query on pg_stat_activity, or connecting).
_JOIN_MARGIN = 5.0


class PrioritizeFailed(RuntimeError):
    """The watcher of a ``prioritize()`` block failed (its ``only`` filter raised, its connection broke...).

    Raised when the block exits, ``from`` the watcher's own exception; an exception of the block itself is its
    ``__context__``. The watcher signalled no session after it failed.
    """


@dataclass
class Prioritized:
    """What ``prioritize()`` yields: the session it protects, and what its watcher did so far.

    Attributes:
        alias: The database alias.
        pid: The protected server session (the caller's connection to ``alias``).
    """

    alias: str
    pid: int
    _signalled: list[inspection.Signalled] = field(default_factory=list, repr=False)

    @property
    def signalled(self) -> tuple[inspection.Signalled, ...]:
        """The blockers signalled so far, in order (each session at most once per block)."""
        return tuple(self._signalled)


def _grace(value: object) -> float:
    # 0 is a real value here ("as soon as the wait is seen"); every other value is a positive duration.
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, timedelta) and value == timedelta(0):
        return 0.0
    return duration(value, "after")


def _interval(value: object) -> float:
    seconds = duration(value, "interval")
    if seconds < MIN_INTERVAL:
        raise ValueError(
            f"interval must be at least {MIN_INTERVAL} seconds (each poll is a query), got {value!r}"
        )
    return seconds


@contextmanager
def prioritize(
    using: str | None = None,
    *,
    after: Duration = 1.0,
    interval: Duration = 0.1,
    action: Literal["terminate", "cancel"] = "terminate",
    only: Callable[[Session], bool] | None = None,
) -> Iterator[Prioritized]:
    """Give this session's lock waits priority: end the sessions blocking it once it has waited ``after`` seconds.

    ``with lockkit.prioritize():`` starts a watcher thread with its own connection to ``using``. Every
    ``interval`` seconds it asks the server which client sessions of the same database block the caller's session
    (``pg_blocking_pids()``), and once the caller has waited at least ``after`` seconds for its current lock
    (``pg_locks.waitstart``) it terminates each of them (``lockkit.inspection.terminate``: the blocker's
    transaction rolls back and its locks are released) or, with ``action="cancel"``, cancels its statement
    (``lockkit.inspection.cancel``: this releases nothing when the blocker is idle in its transaction, between
    statements). Walsenders, autovacuum and other non-client processes, and sessions of other databases, are
    never signalled; each session is signalled at most once per block. The watcher stops, and is joined, when the
    block exits. The wait itself stays bounded by the scope's ``lock_timeout``: a ``lock_timeout`` shorter than
    ``after`` fires first (``LockTimeout``) and nobody is signalled. The protected session is the one the caller's
    connection has when the block begins (it connects if needed): a connection replaced during the block is not. For a migration or a maintenance job that must
    not queue behind a forgotten transaction; it is as blunt as it sounds. PostgreSQL only (14+). See
    https://www.postgresql.org/docs/current/functions-info.html#FUNCTIONS-INFO-SESSION (``pg_blocking_pids``) and
    https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADMIN-SIGNAL.

    Args:
        using: The database alias whose connection (in this thread) is protected; default ``"default"``.
        after: Seconds (or a ``timedelta``; ``0`` for "as soon as seen") the caller must have waited for a lock
            before its blockers are signalled. Default 1 second.
        interval: Seconds between two polls of the watcher, at least 0.01. Default 0.1.
        action: ``"terminate"`` (default) the blocking sessions, or ``"cancel"`` their current statements.
        only: Signal a blocker only when ``only(session)`` is true (a ``lockkit.inspection.Session``: pid,
            application name, user, query, state, transaction age); ``None`` for every blocker. Called in the
            watcher thread; if it raises, the watcher stops and the block ends with ``PrioritizeFailed``.

    Yields:
        A ``Prioritized`` record: the protected ``pid`` and the blockers ``signalled`` so far.

    Raises:
        TypeError, ValueError: a bad ``using``, ``after``, ``interval``, ``action`` or ``only``, before any SQL.
        django.db.NotSupportedError: the database is not PostgreSQL, before any SQL.
        PrioritizeFailed: at exit, the watcher failed (its ``only`` raised, its connection broke, the server
            refused a signal).
    """
    alias = check_alias(using if using is not None else DEFAULT_DB_ALIAS)
    grace = _grace(after)
    pause = _interval(interval)
    if not isinstance(action, str):
        raise TypeError(f"action must be 'terminate' or 'cancel', not {type(action).__name__}")
    if action not in ("terminate", "cancel"):
        raise ValueError(f"action must be 'terminate' or 'cancel', got {action!r}")
    if only is not None and not callable(only):
        raise TypeError(f"only must be a callable taking a Session, or None, not {type(only).__name__}")
    connection = connections[alias]
    backend = backend_for(connection)
    backend.sessions.check_prioritize(connection)
    record = Prioritized(alias, backend.sessions.session_pid(connection))
    stop = threading.Event()
    failures: list[BaseException] = []
    signal = inspection.terminate if action == "terminate" else inspection.cancel

    def watch() -> None:
        own = connections.create_connection(alias)
        try:
            done: set[int] = set()
            while not stop.wait(pause):
                for session in backend.sessions.client_blockers(own, record.pid, waited=grace):
                    if stop.is_set():
                        return
                    if session.pid in done or (only is not None and not only(session)):
                        continue
                    done.add(session.pid)
                    try:
                        record._signalled.append(signal(session.pid, using=alias))
                    except ValueError:
                        # It ended (or was replaced by a session of another database) since the poll.
                        continue
                    logger.warning(
                        "lockkit.prioritize: %s it blocked session %s on %r",
                        record._signalled[-1],
                        record.pid,
                        alias,
                    )
        except BaseException as exc:
            failures.append(exc)
        finally:
            own.close()

    watcher = threading.Thread(target=watch, name=f"lockkit-prioritize-{alias}-{record.pid}", daemon=True)
    watcher.start()
    try:
        yield record
    finally:
        stop.set()
        watcher.join(pause + _JOIN_MARGIN)
        if watcher.is_alive():  # pragma: no cover - a poll stuck on the network; it stops after that poll
            logger.warning(
                "lockkit.prioritize: the watcher of session %s on %r did not stop in time", record.pid, alias
            )
        if failures:
            failure = failures[0]
            raise PrioritizeFailed(
                f"lockkit.prioritize: the watcher of session {record.pid} on {alias!r} failed "
                f"({type(failure).__name__}: {failure}); it signalled no blocker after that"
            ) from failure


__all__ = ["MIN_INTERVAL", "PrioritizeFailed", "Prioritized", "prioritize"]
