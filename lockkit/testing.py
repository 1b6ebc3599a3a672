"""Helpers for testing real lock contention, deterministic and unable to hang; runner-neutral.

``hold_lock`` keeps rows locked from another session, ``wait_until_blocked`` waits until the database itself reports
a session blocked on a holder (``pg_blocking_pids()`` on PostgreSQL, the InnoDB lock-wait tables on MariaDB/MySQL),
``run_concurrently`` starts callers together at a barrier and joins them with a timeout, and ``assert_single_alias``
fails when a query runs on another alias. Use them in transactional tests (``TransactionTestCase`` or
``pytest.mark.django_db(transaction=True)``): other sessions cannot see rows a ``TestCase`` transaction wrote.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections, models, transaction

from lockkit.durations import seconds

T = TypeVar("T")


class ContentionTimeout(AssertionError):
    """A contention helper waited longer than its timeout: the expected blocking or completion never happened."""


def backend_pid(using: str = DEFAULT_DB_ALIAS) -> int:
    """Return the server-side session id of this thread's connection to ``using`` (PostgreSQL pid, MySQL thread)."""
    connection = connections[using]
    query = "SELECT CONNECTION_ID()" if connection.vendor == "mysql" else "SELECT pg_backend_pid()"
    with connection.cursor() as cursor:
        cursor.execute(query)
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@dataclass
class Holder:
    """Rows held locked by another session (see ``hold_lock``).

    Attributes:
        alias: The database alias the lock was taken on.
        pid: The holding session's id, as ``pg_blocking_pids()`` / the InnoDB lock tables report it.
        rows: The locked rows.
    """

    alias: str
    pid: int = 0
    rows: list[Any] = field(default_factory=list)


def _as_queryset(target: object) -> models.QuerySet[Any]:
    if isinstance(target, models.Model):
        if target.pk is None:
            raise ValueError("target is an unsaved instance: it has no row to lock")
        return type(target)._default_manager.filter(pk=target.pk)
    if isinstance(target, type) and issubclass(target, models.Model):
        return target._default_manager.all()
    if isinstance(target, models.QuerySet):
        return target
    raise TypeError(
        f"target must be a model instance, a model class or a QuerySet, not {type(target).__name__}"
    )


@contextmanager
def hold_lock(
    target: object,
    *,
    using: str | None = None,
    nowait: bool = False,
    no_key: bool = False,
    timeout: float = 30.0,
) -> Iterator[Holder]:
    """Lock rows from a separate session and keep them locked until the block exits.

    The lock is taken by a helper thread on its own connection (its own database session), inside a transaction
    that is rolled back when the block exits. The block starts only once the rows are locked.

    Args:
        target: A model instance, a model class or a queryset.
        using: The alias; default: the queryset's own (``queryset.db``).
        nowait: Take the lock with ``NOWAIT`` (fail at once if someone else holds it).
        no_key: Take ``FOR NO KEY UPDATE`` (PostgreSQL) instead of ``FOR UPDATE``.
        timeout: Seconds to wait for the lock to be taken, and the longest the helper holds it if the block never
            exits (so a broken test cannot hang the suite).

    Yields:
        A ``Holder`` with the alias, the holding session's ``pid`` and the locked rows.

    Raises:
        ContentionTimeout: the rows were not locked within ``timeout``.
        TypeError, ValueError: ``target`` is not lockable (an unsaved instance, another type).
        LockNotAvailable, LockTimeout...: the holder's query failed (classified with the holder's own ``nowait``,
            so an enclosing scope does not re-classify it); any other error it raised, unchanged.
    """
    limit = seconds(timeout, "timeout")
    assert limit is not None
    queryset = _as_queryset(target)
    alias = using or queryset.db
    holder = Holder(alias=alias)
    ready, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic(using=alias):
                holder.pid = backend_pid(alias)
                kwargs: dict[str, Any] = {"nowait": nowait}
                if no_key:
                    kwargs["no_key"] = True
                holder.rows = list(queryset.using(alias).select_for_update(**kwargs))
                ready.set()
                release.wait(limit)
                transaction.set_rollback(True, using=alias)
        except BaseException as exc:
            errors.append(_typed(exc, alias, nowait))
        finally:
            ready.set()
            connections.close_all()

    thread = threading.Thread(target=hold, name="lockkit-hold-lock", daemon=True)
    thread.start()
    if not ready.wait(limit):
        release.set()
        raise ContentionTimeout(f"hold_lock: rows were not locked within {limit}s")
    if errors:
        thread.join(limit)
        raise errors[0]
    try:
        yield holder
    finally:
        release.set()
        thread.join(limit)
        if thread.is_alive():
            raise ContentionTimeout(f"hold_lock: the holder did not release within {limit}s")
    if errors:
        raise errors[0]


def _typed(exc: BaseException, alias: str, nowait: bool) -> BaseException:
    """The lockkit error for a holder's database failure, classified with the holder's own ``nowait``."""
    from lockkit.errors import ERROR_FOR_FAILURE, classify
    from lockkit.sqlstate import code_of

    failure = classify(exc, nowait=nowait)
    if failure is None:
        return exc
    error = ERROR_FOR_FAILURE[failure](
        f"hold_lock: {failure.value}: {exc}", sqlstate=code_of(exc), alias=alias
    )
    error.__cause__ = exc
    return error


_BLOCKED_SQL = {
    "postgresql": "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid)) ORDER BY pid",
    "mysql": (
        "SELECT r.trx_mysql_thread_id FROM information_schema.innodb_lock_waits w "
        "JOIN information_schema.innodb_trx r ON r.trx_id = w.requesting_trx_id "
        "JOIN information_schema.innodb_trx b ON b.trx_id = w.blocking_trx_id "
        "WHERE b.trx_mysql_thread_id = %s ORDER BY r.trx_mysql_thread_id"
    ),
}


# InnoDB refreshes the information_schema lock tables only when they were not read in the last 100 ms: polling
# faster than that keeps the cache from ever refreshing, and the waiter never appears.
_MIN_POLL = {"mysql": 0.11}


def blocked_by(holder: Holder | int, *, using: str = DEFAULT_DB_ALIAS) -> list[int]:
    """Return the session ids the database reports as waiting for a lock held by ``holder``, right now."""
    pid = holder.pid if isinstance(holder, Holder) else holder
    alias = holder.alias if isinstance(holder, Holder) else using
    connection = connections.create_connection(alias)  # its own session: not inside the caller's transaction
    try:
        sql = _BLOCKED_SQL.get(connection.vendor)
        if sql is None:
            raise NotImplementedError(f"blocked_by does not support {connection.vendor}")
        with connection.cursor() as cursor:
            cursor.execute(sql, [pid])
            return [int(row[0]) for row in cursor.fetchall()]
    finally:
        connection.close()


def wait_until_blocked(
    holder: Holder | int,
    *,
    count: int = 1,
    using: str = DEFAULT_DB_ALIAS,
    timeout: float = 10.0,
    poll: float = 0.005,
) -> list[int]:
    """Return once at least ``count`` sessions wait for a lock held by ``holder``, as the database reports it.

    This is what a contention test waits on instead of ``sleep()``: on PostgreSQL ``pg_blocking_pids()``
    (https://www.postgresql.org/docs/current/functions-info.html), on MariaDB/MySQL the InnoDB lock-wait tables.

    Args:
        holder: A ``Holder`` from ``hold_lock`` or a session id (``backend_pid()``).
        count: How many blocked sessions to wait for.
        using: The alias, when ``holder`` is a bare session id.
        timeout: Seconds before giving up.
        poll: Seconds between polls (at least 0.11 on MariaDB/MySQL, whose InnoDB lock tables are a cache that a
            read within the last 100 ms keeps from refreshing).

    Returns:
        The blocked session ids.

    Raises:
        ContentionTimeout: fewer than ``count`` sessions were blocked within ``timeout``.
    """
    limit = seconds(timeout, "timeout")
    pause = seconds(poll, "poll")
    assert limit is not None
    assert pause is not None
    pid = holder.pid if isinstance(holder, Holder) else holder
    alias = holder.alias if isinstance(holder, Holder) else using
    connection = connections.create_connection(alias)
    deadline = time.monotonic() + limit
    blocked: list[int] = []
    try:
        sql = _BLOCKED_SQL.get(connection.vendor)
        if sql is None:
            raise NotImplementedError(f"wait_until_blocked does not support {connection.vendor}")
        with connection.cursor() as cursor:
            while True:
                cursor.execute(sql, [pid])
                blocked = [int(row[0]) for row in cursor.fetchall()]
                if len(blocked) >= count:
                    return blocked
                if time.monotonic() >= deadline:
                    raise ContentionTimeout(
                        f"wait_until_blocked: {len(blocked)} session(s) blocked by {pid} after {limit}s, "
                        f"expected {count}"
                    )
                time.sleep(max(pause, _MIN_POLL.get(connection.vendor, 0.0)))
    finally:
        connection.close()


@dataclass
class Outcome(Generic[T]):
    """What one concurrent caller did: its index, and its result or the exception it raised."""

    index: int
    result: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def run_concurrently(
    func: Callable[..., T],
    n: int,
    *,
    args: Sequence[tuple[Any, ...]] | tuple[Any, ...] = (),
    timeout: float = 30.0,
    reraise: bool = False,
) -> list[Outcome[T]]:
    """Run ``func`` in ``n`` threads that start together at a barrier, and join them with a timeout.

    Each thread has its own database connections (Django's are per thread) and closes them when it ends.

    Args:
        func: The callable each thread runs.
        n: How many threads.
        args: One tuple of arguments for every caller, or a sequence of ``n`` tuples, one per caller.
        timeout: Seconds for all callers to finish.
        reraise: Re-raise the first caller's exception (by index) instead of returning it in the outcomes.

    Returns:
        One ``Outcome`` per caller, in index order.

    Raises:
        ContentionTimeout: a caller had not finished within ``timeout``.
        ValueError, TypeError: ``n`` is not a positive int, or ``args`` is not ``n`` tuples.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    limit = seconds(timeout, "timeout")
    assert limit is not None
    if isinstance(args, tuple):
        per_call: list[tuple[Any, ...]] = [args] * n
    else:
        per_call = [tuple(a) for a in args]
        if len(per_call) != n:
            raise ValueError(f"args must hold n={n} tuples, got {len(per_call)}")
    barrier = threading.Barrier(n)
    outcomes: list[Outcome[T]] = [Outcome(i) for i in range(n)]

    def call(i: int) -> None:
        try:
            barrier.wait(limit)
            outcomes[i].result = func(*per_call[i])
        except BaseException as exc:
            outcomes[i].error = exc
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=call, args=(i,), daemon=True, name=f"lockkit-caller-{i}") for i in range(n)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + limit
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        raise ContentionTimeout(
            f"run_concurrently: {len(stuck)} caller(s) still running after {limit}s: {stuck}"
        )
    if reraise:
        for outcome in outcomes:
            if outcome.error is not None:
                raise outcome.error
    return outcomes


@dataclass
class AliasLog:
    """Queries seen by ``assert_single_alias``: ``(alias, sql)`` pairs, in order."""

    alias: str
    queries: list[tuple[str, str]] = field(default_factory=list)

    def on(self, alias: str) -> list[str]:
        return [sql for a, sql in self.queries if a == alias]


@contextmanager
def assert_single_alias(alias: str) -> Iterator[AliasLog]:
    """Fail if any query inside the block, in this thread, runs on a database alias other than ``alias``.

    Yields:
        An ``AliasLog`` of every query seen, per alias.

    Raises:
        AssertionError: on exit, when a query ran on another alias (the message lists them).
    """
    log = AliasLog(alias)

    def watcher(name: str) -> Callable[..., Any]:
        def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
            log.queries.append((name, sql))
            return execute(sql, params, many, context)

        return wrapper

    with ExitStack() as stack:
        for name in connections:
            stack.enter_context(connections[name].execute_wrapper(watcher(name)))
        yield log
    strays = [(a, sql) for a, sql in log.queries if a != alias]
    if strays:
        listing = "\n".join(f"  {a}: {sql}" for a, sql in strays)
        raise AssertionError(f"{len(strays)} query(ies) ran outside alias {alias!r}:\n{listing}")


__all__ = [
    "AliasLog",
    "ContentionTimeout",
    "Holder",
    "Outcome",
    "assert_single_alias",
    "backend_pid",
    "blocked_by",
    "hold_lock",
    "run_concurrently",
    "wait_until_blocked",
]
