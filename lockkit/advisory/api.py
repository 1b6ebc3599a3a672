"""``lockkit.advisory_lock``: a named lock for a block or a function, transaction-scoped or session-level.

Configuration lives on the ``AdvisoryLock`` object; each entry's state (the lock taken, the scope opened) lives in
a ``ContextVar`` stack, as Django's ``atomic`` keeps its state on the connection: one decorated function is safe
to call from many threads at once.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections

from lockkit._engine.liveness import discard_after_loss, discard_if_dead
from lockkit._engine.transaction import in_transaction
from lockkit.advisory import held as advisory_locks
from lockkit.advisory.held import HeldLock
from lockkit.advisory.keys import AdvisoryKey, advisory_key
from lockkit.backends import backend_for
from lockkit.capabilities import pooler
from lockkit.conf import advisory_namespace
from lockkit.errorcodes.translate import translating
from lockkit.errors import ConnectionLost, Failure
from lockkit.retries import call_with_retry, from_settings
from lockkit.scopes.aliases import check_alias
from lockkit.scopes.blocks import Locked, locked, refuse_unsupported
from lockkit.scopes.options import FROM_SETTINGS
from lockkit.validation import flag, optional_duration

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class _Entry:
    owner: AdvisoryLock
    held: HeldLock | None
    scope: Locked | None  # the locked() scope of a transaction-scoped lock


_entries: ContextVar[tuple[_Entry, ...]] = ContextVar("lockkit_advisory_entries", default=())

#: The kinds taking an advisory lock retries: a connection lost (or refused) before the lock was taken. A lock
#: timeout is the caller's to decide on. Attempts, waits and ``reconnect_within`` come from
#: ``settings.LOCKKIT["RETRY"]``; ``None`` there: no retries.
RETRIED = frozenset({Failure.CONNECTION_LOST})


class AdvisoryLock:
    """What ``advisory_lock()`` returns: a context manager yielding a ``HeldLock``, and a decorator.

    It holds configuration only: entering it twice (nested, in threads, in tasks) takes the lock twice.
    """

    def __init__(
        self,
        key: AdvisoryKey,
        *,
        using: str | None,
        shared: bool,
        nowait: bool,
        lock_timeout: Any,
        session: bool,
    ) -> None:
        """Hold the validated configuration (no per-call state)."""
        self.key = key
        self.using = using
        self.shared = shared
        self.nowait = nowait
        self.lock_timeout = lock_timeout
        self.session = session

    def __repr__(self) -> str:
        """Show the key, the alias and the kind of lock."""
        mode = "session" if self.session else "transaction"
        return f"<AdvisoryLock key={self.key.source!r} using={self.using!r} {mode}{' shared' if self.shared else ''}>"

    def _scope(self, alias: str) -> Locked:
        return locked(alias, nowait=self.nowait, lock_timeout=self.lock_timeout)

    def __enter__(self) -> HeldLock:
        """Take the lock (in a new scope, or session-level) and return the ``HeldLock``.

        Outside any transaction, a connection lost or refused before the lock was taken (nothing is held then) is
        retried as ``settings.LOCKKIT["RETRY"]`` retries a lost connection (``RETRIED``).
        """
        alias = check_alias(self.using if self.using is not None else DEFAULT_DB_ALIAS)
        # The project's namespace is read at each entry (settings are read lazily), before any SQL.
        key = advisory_key(self.key.source, namespace=advisory_namespace())
        if self.session:
            _warn_if_pooled(alias)
        # Inside a transaction a lost connection took the caller's transaction with it: never retried here.
        setting = None if in_transaction(connections[alias]) else from_settings(retry_on=RETRIED)
        if setting is None:
            entry = self._take(alias, key, 1)
        else:
            take = functools.partial(self._take, alias, key)
            entry = call_with_retry(setting, take, alias=alias, operation="lockkit.advisory_lock")
        _entries.set((*_entries.get(), entry))
        assert entry.held is not None
        return entry.held

    def _take(self, alias: str, key: AdvisoryKey, number: int) -> _Entry:
        """One attempt at taking the lock: the entry holding it, or the error (nothing held)."""
        connection = connections[alias]
        backend = backend_for(connection)
        try:
            # Connects here, on every vendor (a dead kept connection first closed): a server refusing connections
            # is a ConnectionLost of this attempt, retried by this call's own budget, not met again by the scope
            # below, whose entry would wait out a second reconnect_within of its own (found by a review: twice
            # the setting).
            with translating(alias, nowait=self.nowait, attempts=number):
                if not in_transaction(connection):
                    discard_if_dead(alias)
                connection.ensure_connection()
                backend.locks.check_advisory(connection, shared=self.shared, session=self.session)
        except ConnectionLost:
            discard_after_loss(alias)
            raise
        entry = _Entry(self, None, None)
        if self.session:
            taken: list[HeldLock] = []  # the lock, as soon as the server granted it (see advisory_locks.take)
            try:
                # A short transaction only to bound the wait (transaction-scoped lock_timeout); the lock outlives
                # it, being session-level.
                with self._scope(alias) as scope:
                    advisory_locks.take(
                        alias,
                        key,
                        shared=self.shared,
                        session=True,
                        nowait=self.nowait,
                        lock_timeout=scope.lock_timeout,
                        record=taken.append,
                        unless_held=not self._held_here(alias, key),
                    )
            except BaseException:
                if (
                    taken
                ):  # taken, then the short transaction failed to end (or was interrupted): give it back
                    advisory_locks.give_back(taken[0], raise_errors=False)
                raise
            entry.held = taken[0]
        else:
            scope_cm = self._scope(alias)
            scope = scope_cm.__enter__()
            try:
                entry.held = scope.advisory_lock(self.key.source, shared=self.shared)
            except BaseException as exc:
                scope_cm.__exit__(type(exc), exc, exc.__traceback__)
                raise
            entry.scope = scope_cm
        return entry

    def _held_here(self, alias: str, key: AdvisoryKey) -> bool:
        """Whether an enclosing entry of this thread or task holds the key on ``alias``.

        Entering again is then the server's re-entrancy on this client's own session, not another client's lock
        (``AdvisoryLockAlreadyHeld``).
        """
        return any(
            e.held is not None
            and e.held.alias == alias
            and (e.held.key.value, e.held.key.pair) == (key.value, key.pair)
            for e in _entries.get()
        )

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """End this object's innermost entry: the scope (and its lock), or release the session lock."""
        stack = _entries.get()
        entry = next((e for e in reversed(stack) if e.owner is self), None)
        if entry is None:  # pragma: no cover - misuse only (exit without enter)
            raise RuntimeError(f"{self!r} exited without being entered in this thread or task")
        _entries.set(tuple(e for e in stack if e is not entry))
        if entry.scope is not None:
            entry.scope.__exit__(exc_type, exc, tb)
        elif entry.held is not None:
            advisory_locks.give_back(entry.held, raise_errors=exc is None)

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        """Decorate ``func`` so each call runs holding the lock."""
        refuse_unsupported(func, "advisory_lock")

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return func(*args, **kwargs)

        return wrapper


def _warn_if_pooled(alias: str) -> None:
    found = pooler(connections[alias].settings_dict)
    if found is not None:
        warnings.warn(
            f"advisory_lock(session=True) on {alias!r}, which looks like it is behind a connection pooler "
            f"({found}): a session-level lock needs one server session for the whole block, which a pooler in "
            "transaction mode does not give (lockkit refuses the key with AdvisoryLockAlreadyHeld when the server "
            "session it gets already holds it, and raises AdvisoryLockLost at the end if another session "
            "releases it); use session pooling, a direct connection for this alias, or session=False",
            RuntimeWarning,
            stacklevel=3,
        )


def advisory_lock(
    key: int | str | tuple[int | str, int | str],
    *,
    using: str | None = None,
    shared: bool = False,
    nowait: bool = False,
    lock_timeout: Any = FROM_SETTINGS,
    session: bool = False,
) -> AdvisoryLock:
    """Hold a named (advisory) lock for a block or for each call of a function: "run this once across servers".

    ``with lockkit.advisory_lock("nightly-report"):`` opens a locked scope on ``using`` and takes the key in its
    transaction (PostgreSQL ``pg_advisory_xact_lock``; MariaDB/MySQL ``GET_LOCK``, released when the scope ends on
    every path); the block runs inside that transaction. ``session=True`` takes a session-level lock
    (``pg_advisory_lock``) in a short transaction that only bounds the wait, runs the block outside any
    transaction (for management commands, migrations and cron jobs that commit as they go), and releases it when
    the block exits, however it exits; if the process dies, the server drops the lock with the session. Also a
    decorator: ``@advisory_lock("nightly-report", session=True)``. Outside any transaction, a connection lost or
    refused before the lock was taken is retried for ``settings.LOCKKIT["RETRY"]``'s ``reconnect_within`` (5 s by
    default), like a scope's; nothing else is retried: inside a ``locked_operation`` a ``LockTimeout`` is retried
    like any other. See
    https://www.postgresql.org/docs/current/explicit-locking.html#ADVISORY-LOCKS and
    https://mariadb.com/kb/en/get_lock/.

    Args:
        key: An ``int`` (signed 64-bit), a ``str`` (hashed to 64 bits as django-pglock hashes it, so the same
            PostgreSQL lock as ``pglock.advisory(key)``; see ``lockkit.advisory.keys.hash_text``) or a
            ``(namespace, key)`` pair; see docs/advisory.md for what collisions mean. With
            ``settings.LOCKKIT["ADVISORY_NAMESPACE"]`` set, text is hashed in that namespace (read at each entry).
        using: The database alias (default ``"default"``).
        shared: Take a shared lock (PostgreSQL only): shared holders exclude exclusive ones, not each other.
        nowait: Fail at once with ``LockNotAvailable`` when another session holds the key.
        lock_timeout: Seconds (or a ``timedelta``) to wait for the key; ``None`` waits as long as the server does.
            Default ``settings.LOCKKIT["LOCK_TIMEOUT"]`` (5 seconds).
        session: Hold a session-level lock, with the block outside any transaction.

    Returns:
        An ``AdvisoryLock``: a context manager yielding a ``HeldLock`` (alias, key, server session id), and a
        decorator.

    Raises:
        TypeError, ValueError: a bad key, flag, alias or duration, before any SQL runs; on entry, before any SQL,
            a bad ``settings.LOCKKIT["ADVISORY_NAMESPACE"]`` (``lockkit.conf.SettingTypeError``/``SettingValueError``,
            naming it).
        django.db.NotSupportedError: on entry, before any SQL: ``shared`` on MariaDB/MySQL, ``session`` on SQLite,
            or a database without advisory locks.
        LockNotAvailable: with ``nowait``, another session holds the key (the message names the key and the
            holder's server session id).
        LockTimeout: the key was not granted within ``lock_timeout`` (the message names the key and the holder).
        ConnectionLost: the connection was lost, or the server refused it, before the key was taken, on every
            attempt for ``settings.LOCKKIT["RETRY"]``'s ``reconnect_within`` (once inside a transaction).
        AdvisoryLockAlreadyHeld: (``session=True``) on entry, the server session this connection got already held
            the key and no enclosing block of this thread or task took it: a pooler in transaction mode handed it
            another client's session; refused in the statement that would have taken it, nothing taken.
        AdvisoryLockLost: (``session=True``) at exit, the session that took the lock no longer held it (the
            connection was replaced, or a transaction-mode pooler served the block from another server session).
    """
    checked = advisory_key(key)
    if using is not None:
        check_alias(using)
    if lock_timeout is not FROM_SETTINGS:
        optional_duration(lock_timeout, "lock_timeout")
    return AdvisoryLock(
        checked,
        using=using,
        shared=flag(shared, "shared"),
        nowait=flag(nowait, "nowait"),
        lock_timeout=lock_timeout,
        session=flag(session, "session"),
    )


__all__ = ["AdvisoryLock", "advisory_lock"]
