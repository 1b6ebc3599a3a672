"""Asking the database who is waiting for whose locks: what a contention test waits on instead of ``sleep()``.

PostgreSQL reports it through ``pg_blocking_pids()``; MariaDB through
``information_schema.innodb_lock_waits``; MySQL 8 through ``performance_schema.data_lock_waits``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from lockkit.backends import backend_for
from lockkit.scopes.aliases import check_alias
from lockkit.testing.failures import ContentionTimeout
from lockkit.testing.holding import Holder
from lockkit.testing.sessions import lock_wait_edges
from lockkit.testing.threads import ThreadCall
from lockkit.validation import Duration, duration


def _behind(pid: int, edges: Iterable[tuple[int, int]]) -> list[int]:
    """Sessions waiting for ``pid`` directly, or behind another session that waits for it (queued on one row)."""
    waiting_for: dict[int, set[int]] = {}
    for waiter, blocker in edges:
        waiting_for.setdefault(blocker, set()).add(waiter)
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        for waiter in waiting_for.get(frontier.pop(), ()):
            if waiter != pid and waiter not in found:
                found.add(waiter)
                frontier.append(waiter)
    return sorted(found)


def _target(holder: Holder | int, using: str | None) -> tuple[int, str]:
    if isinstance(holder, Holder):
        return holder.pid, check_alias(using if using is not None else holder.alias)
    if isinstance(holder, bool) or not isinstance(holder, int):
        raise TypeError(f"holder must be a Holder or a session id (int), not {type(holder).__name__}")
    return holder, check_alias(using if using is not None else DEFAULT_DB_ALIAS)


def _read_edges(cursor: Any, sql: str) -> list[tuple[int, int]]:
    cursor.execute(sql)
    return [(int(waiter), int(blocker)) for waiter, blocker in cursor.fetchall()]


def blocked_by(holder: Holder | int, *, using: str | None = None) -> list[int]:
    """Return the sessions the database reports waiting for ``holder``'s locks right now.

    A session counts when it waits for a lock ``holder`` holds, or queues behind another session that does
    (two contenders on one row). Asked over a fresh connection, outside any transaction of the caller.

    Args:
        holder: A ``Holder`` from ``hold_lock``, or a session id from ``backend_pid()``.
        using: The alias to ask; default the holder's alias, or ``"default"`` for a bare session id.

    Returns:
        The waiting session ids, ascending.

    Raises:
        TypeError, ValueError: ``holder`` or ``using`` is invalid.
        NotImplementedError: the database is neither PostgreSQL nor MariaDB/MySQL.
    """
    pid, alias = _target(holder, using)
    return _behind(pid, lock_wait_edges(alias))


def wait_until_blocked(
    holder: Holder | int,
    *,
    count: int = 1,
    using: str | None = None,
    timeout: Duration = 10.0,
    poll: Duration = 0.005,
    contenders: ThreadCall[Any] | Sequence[ThreadCall[Any]] = (),
) -> list[int]:
    """Return once at least ``count`` sessions wait for ``holder``'s locks, as the database itself reports it.

    This replaces ``sleep()`` in contention tests: after starting a contender, wait until it is really queued
    on the row, then release. It polls ``pg_blocking_pids()`` on PostgreSQL
    (https://www.postgresql.org/docs/current/functions-info.html) or the InnoDB lock-wait tables on
    MariaDB/MySQL, over its own connection.

    Args:
        holder: A ``Holder`` from ``hold_lock``, or a session id from ``backend_pid()``.
        count: How many waiting sessions to wait for (a positive ``int``).
        using: The alias to ask; default the holder's alias, or ``"default"`` for a bare session id.
        timeout: Seconds before giving up.
        poll: Seconds between two polls (at least 0.15 on MariaDB/MySQL, whose InnoDB lock tables are a cache
            that is refreshed only after 100 ms without a read).
        contenders: The ``ThreadCall`` (or calls) expected to block: when fewer than ``count`` of them are
            still running, no amount of waiting can succeed, so it fails at once with what they returned or raised.

    Returns:
        The waiting session ids, ascending.

    Raises:
        ContentionTimeout: fewer than ``count`` sessions were waiting within ``timeout``, or the contenders
            finished without blocking.
        TypeError, ValueError: an argument has the wrong type or value.
        NotImplementedError: the database is neither PostgreSQL nor MariaDB/MySQL.
    """
    pid, alias = _target(holder, using)
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int, not {type(count).__name__}")
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    limit, pause = duration(timeout, "timeout"), duration(poll, "poll")
    watched = [contenders] if isinstance(contenders, ThreadCall) else list(contenders)
    if not all(isinstance(call, ThreadCall) for call in watched):
        raise TypeError("contenders must be a ThreadCall or a sequence of them (from in_thread)")
    connection = connections.create_connection(alias)
    deadline = time.monotonic() + limit
    try:
        dialect = backend_for(connection).sessions.contention_sql(connection)
        sql, pause = dialect.blocking_edges, max(pause, dialect.min_poll)
        with connection.cursor() as cursor:
            while True:
                edges = _read_edges(cursor, sql)
                waiting = _behind(pid, edges)
                if len(waiting) >= count:
                    return waiting
                if watched and sum(not call.done() for call in watched) < count:
                    finished = "; ".join(f"{call.name}: {_describe(call)}" for call in watched if call.done())
                    raise ContentionTimeout(
                        f"wait_until_blocked: expected {count} session(s) waiting for {pid} on {alias!r}, "
                        f"but the contenders finished without blocking ({finished})"
                    )
                if time.monotonic() >= deadline:
                    raise ContentionTimeout(
                        f"wait_until_blocked: {len(waiting)} session(s) waiting for {pid} on {alias!r} "
                        f"after {limit}s, expected {count}; the lock waits the database reported "
                        f"(waiting, blocker): {edges}"
                    )
                time.sleep(pause)
    finally:
        connection.close()


def _describe(call: ThreadCall[Any]) -> str:
    outcome = call.outcome(timeout=1.0)
    return f"raised {outcome.error!r}" if outcome.error is not None else f"returned {outcome.result!r}"


__all__ = ["blocked_by", "wait_until_blocked"]
