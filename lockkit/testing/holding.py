"""``hold_lock``: rows kept locked by another database session for the length of a ``with`` block.

The session lives in a helper thread that owns its own connection and transaction, so the test's thread stays
free to start contenders, wait for them to block, and check what they did.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import connections, models, transaction

from lockkit.backends import backend_for
from lockkit.scopes import aliases
from lockkit.scopes.blocks import locked
from lockkit.testing.failures import ContentionTimeout, NothingLocked, invisible_rows
from lockkit.testing.sessions import backend_pid, lock_wait_edges, open_session_id
from lockkit.validation import Duration, duration

T = TypeVar("T")

# Seconds allowed on top of ``timeout`` for the holder to connect before its lock wait starts.
_CONNECT_MARGIN = 5.0
# Seconds between two questions to the database, inside a caller's transaction: is the holder waiting for it?
_OWN_WAIT_POLL = 0.2


@dataclass
class _Job:
    func: Callable[[], Any] | None  # None: end the transaction
    commit: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class Holder:
    """A database session holding row locks for a ``hold_lock`` block.

    Attributes:
        alias (str): The database alias the lock was taken on.
        pid (int): The holding session's id, as ``pg_blocking_pids()`` and the InnoDB lock tables report it.
        rows (list): The locked rows, as the holding session read them.
    """

    def __init__(self, alias: str, timeout: float) -> None:
        """Make a holder for ``alias`` whose lock may last ``timeout`` seconds; ``hold_lock`` starts it."""
        self.alias = alias
        self.pid = 0
        self.rows: list[Any] = []
        self._timeout = timeout
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._ended = False
        self.expired = False  # the block outlived ``timeout``: the helper gave the lock up by itself
        self.thread: threading.Thread | None = None

    def __repr__(self) -> str:
        """Show the alias, the holding session and how many rows it locked."""
        return f"<Holder alias={self.alias!r} pid={self.pid} rows={len(self.rows)} released={self._ended}>"

    @property
    def released(self) -> bool:
        """Whether the holding transaction has ended (``release()`` or the end of the block)."""
        return self._ended

    def _submit(self, job: _Job) -> _Job:
        thread = self.thread
        if self._ended or thread is None or not thread.is_alive():
            raise RuntimeError(f"{self!r}: the holding transaction has already ended")
        self._jobs.put(job)
        if not job.done.wait(self._timeout):
            raise ContentionTimeout(f"{self!r}: the holding session did not answer within {self._timeout}s")
        return job

    def run(self, func: Callable[[], T]) -> T:
        """Run ``func()`` in the holding session (its thread, inside its transaction) and return its result.

        Use it to write while holding the lock, e.g. ``holder.run(lambda:
        Item.objects.filter(pk=1).update(v=2))``; the write becomes visible to others when the holder commits
        (``release(commit=True)``).

        Raises:
            ContentionTimeout: ``func`` did not finish within the holder's ``timeout``.
            RuntimeError: the holding transaction has ended.
            Exception: whatever ``func`` raised, raised again here.
        """
        if not callable(func):
            raise TypeError(f"func must be callable, not {type(func).__name__}")
        job = self._submit(_Job(func))
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[no-any-return]

    def release(self, *, commit: bool = False) -> None:
        """End the holding transaction now, committing it or rolling it back; wait for the session to close.

        Idempotent: releasing twice, or leaving the block after a release, does nothing more.

        Raises:
            ContentionTimeout: the session did not end within the holder's ``timeout``.
            Exception: whatever the commit raised, raised again here.
        """
        if self._ended:
            return
        job = self._submit(_Job(None, commit=commit))
        self._ended = True
        assert self.thread is not None
        self.thread.join(self._timeout)
        if self.thread.is_alive():
            raise ContentionTimeout(f"{self!r}: the holding session did not close within {self._timeout}s")
        if job.error is not None:
            raise job.error

    def _serve(self, end: _Job | None) -> _Job | None:
        """Run jobs until one ends the transaction; return it (or ``None`` when the holder expired)."""
        deadline = time.monotonic() + self._timeout  # the cap on the whole hold, however many run() calls
        while True:
            try:
                job = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.expired = True
                return end
            if job.func is None:
                return job
            try:
                job.result = job.func()
            except BaseException as exc:
                job.error = exc
            job.done.set()


def _as_queryset(target: object) -> tuple[models.QuerySet[Any], str | None]:
    """The rows to lock, and the alias they are bound to (an instance's database, a ``using()``)."""
    if isinstance(target, models.Model):
        if target.pk is None:
            raise ValueError("target is an unsaved instance: it has no row to lock")
        return type(target)._default_manager.filter(pk=target.pk), target._state.db
    if isinstance(target, type) and issubclass(target, models.Model):
        return target._default_manager.all(), None
    if isinstance(target, models.QuerySet):
        return target, target._db  # type: ignore[attr-defined]  # the explicit alias, unlike .db
    raise TypeError(
        f"target must be a model instance, a model class or a queryset, not {type(target).__name__}"
    )


def _nothing_locked(queryset: models.QuerySet[Any], alias: str) -> NothingLocked:
    return NothingLocked(
        invisible_rows(
            f"hold_lock: {queryset.model.__name__} matched no rows on {alias!r} as seen from the holder's own "
            "session."
        )
    )


@contextmanager
def hold_lock(
    target: object,
    *,
    using: str | None = None,
    nowait: bool = False,
    no_key: bool = False,
    timeout: Duration = 30.0,
) -> Iterator[Holder]:
    """Lock rows from a separate database session, and keep them locked until the block exits.

    A helper thread opens its own connection and a ``lockkit.locked()`` scope on the alias (its lock wait
    bounded by ``timeout``), locks the rows with ``scope.lock()`` and waits; the block starts only once the rows
    are locked. On exit the transaction is rolled back (unless ``holder.release(commit=True)`` ended it
    earlier) and the connection closed. Usable from the test's main thread; use it in a transactional test
    (``TransactionTestCase``, ``django_db(transaction=True)``) so the holder can see the test's rows. See
    https://www.postgresql.org/docs/current/explicit-locking.html#LOCKING-ROWS.

    Args:
        target: A saved model instance (its row), a model class (all its rows) or a queryset.
        using: The alias; default the target's own (an instance's database, a queryset's ``using()``), else
            ``router.db_for_write`` of its model, the alias a lock on it would use.
        nowait: Take the lock with ``NOWAIT``: fail at once if another session holds a row.
        no_key: Take ``FOR NO KEY UPDATE`` (PostgreSQL only) instead of ``FOR UPDATE``.
        timeout: Seconds: the holder's own lock wait bound, how long to wait for it to lock, and the longest
            it keeps the lock if the block never ends (it then releases and the exit raises
            ``ContentionTimeout``).

    Yields:
        The ``Holder``: its alias, session id (``pid``) and locked ``rows``; ``run()`` and ``release()``.

    Raises:
        TypeError: ``target`` is not a saved instance, model class or queryset; a flag is not a ``bool``.
        ValueError: ``target`` is unsaved; ``using`` is not a configured alias; ``timeout`` is not positive.
        NothingLocked: the target matched no rows as the holder's session sees them (typically rows written
            inside the uncommitted transaction of a ``TestCase`` or non-transactional ``django_db`` test), or
            the caller's own uncommitted transaction holds the rows (MariaDB's lock on a row it inserted): the
            holder would wait for the caller, which waits for the holder.
        LockNotAvailable: with ``nowait``, another session holds a row.
        LockTimeout: without ``nowait``, another session held a row longer than ``timeout``.
        ContentionTimeout: the rows were not locked, or the session did not close, within ``timeout``; or
            the block lasted longer than ``timeout``, so the lock was released early.
        django.db.NotSupportedError: the database cannot honour ``nowait``/``no_key``.
        NotImplementedError: the database is neither PostgreSQL nor MariaDB/MySQL (SQLite has no row locks).
    """
    queryset, bound = _as_queryset(target)
    # lockkit's own rule (the explicit alias, else the router's write alias), after the target's own binding.
    alias = aliases.resolve(using if using is not None else bound, queryset.model)
    backend_for(connections[alias]).sessions.contention_sql(
        connections[alias]
    )  # refuses SQLite (no row locks, no sessions) before the thread starts
    limit = duration(timeout, "timeout")
    # Built here, so that bad options fail in the caller's thread before any SQL; entered by the helper thread.
    # locked() bounds the lock wait for this transaction only and turns database failures into lockkit's typed
    # errors (LockNotAvailable, LockTimeout...), exactly as for the code under test.
    scope_options = locked(alias, lock_timeout=limit, nowait=nowait, no_key=no_key)
    holder = Holder(alias, limit)
    ready = threading.Event()
    outcome: dict[str, BaseException] = {}

    def hold() -> None:
        end: _Job | None = None
        try:
            with scope_options as scope:
                holder.pid = backend_pid(alias)
                holder.rows = list(scope.lock(queryset.using(alias)))
                if not holder.rows:
                    raise _nothing_locked(queryset, alias)
                ready.set()
                end = holder._serve(end)
                if end is None or not end.commit:
                    transaction.set_rollback(True, using=alias)
            if end is not None:
                end.done.set()
        except BaseException as exc:
            outcome["error"] = exc
            if end is not None:
                end.error = exc
                end.done.set()
        finally:
            holder._ended = True
            ready.set()
            connections.close_all()

    # Inside a transaction of the caller's (a TestCase's), the caller's own session may hold the rows: a row it
    # wrote or locked and has not committed. The holder would wait for it until ``timeout``; asked every
    # _OWN_WAIT_POLL seconds, the database says so at once.
    caller = connections[alias]
    own = open_session_id(caller) if caller.in_atomic_block else None
    holder.thread = threading.Thread(target=hold, name=f"lockkit-hold-lock-{alias}", daemon=True)
    holder.thread.start()
    # The database's own lock wait bound (``limit``) fires first; the margin covers connecting.
    deadline = time.monotonic() + limit + _CONNECT_MARGIN
    while not ready.wait(_OWN_WAIT_POLL if own is not None else limit + _CONNECT_MARGIN):
        if time.monotonic() >= deadline:
            raise ContentionTimeout(f"hold_lock: the rows were not locked on {alias!r} within {limit}s")
        if own is not None and holder.pid and (holder.pid, own) in lock_wait_edges(alias):
            # Its lock wait fails at once instead of at its timeout.
            backend_for(caller).sessions.cancel_statement(alias, holder.pid)
            holder.thread.join(limit)
            raise NothingLocked(
                invisible_rows(
                    f"hold_lock: {queryset.model.__name__}'s rows on {alias!r} are locked by the test's own "
                    f"session ({own}), inside its uncommitted transaction: the holder would wait for them until "
                    f"its timeout."
                )
            )
    if "error" in outcome:
        holder.thread.join(limit)
        raise outcome["error"]
    try:
        yield holder
    except BaseException:
        # The block's own exception is the one to report; releasing is cleanup here.
        with contextlib.suppress(Exception):
            holder.release(commit=False)
        raise
    holder.release(commit=False)
    if holder.expired:
        raise ContentionTimeout(
            f"hold_lock: the block lasted longer than timeout={limit}s, the lock was released early"
        )


__all__ = ["Holder", "hold_lock"]
