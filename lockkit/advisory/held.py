"""Taking and giving back advisory locks on one connection, with lockkit's typed errors; used by scopes.

What a ``LockScope`` and ``lockkit.advisory_lock`` share: the backend call, the mapping of "not granted" to
``LockNotAvailable``/``LockTimeout``, and a release that never leaves a lock on a connection someone reuses.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from lockkit.advisory.keys import AdvisoryKey
from lockkit.backends import backend_for
from lockkit.backends.base import Backend
from lockkit.errorcodes.translate import translating
from lockkit.errors import AdvisoryLockAlreadyHeld, AdvisoryLockLost, LockError, LockNotAvailable, LockTimeout

logger = logging.getLogger("lockkit.advisory")


@dataclass(frozen=True)
class HeldLock:
    """One advisory lock this thread holds on ``alias``: what to release, and the server session holding it.

    Attributes:
        alias: The database alias.
        key: The key.
        shared: Whether it is a shared lock.
        session: Whether it is session-level (released explicitly) rather than transaction-scoped.
        pid: The server session id that took it (``None`` on SQLite).
    """

    alias: str
    key: AdvisoryKey
    shared: bool
    session: bool
    pid: int | None


def take(
    alias: str,
    key: AdvisoryKey,
    *,
    shared: bool,
    session: bool,
    nowait: bool,
    lock_timeout: float | None,
    attempts: int = 1,
    record: Callable[[HeldLock], None] | None = None,
    unless_held: bool = False,
) -> HeldLock:
    """Take an advisory lock on this thread's connection to ``alias``, inside the caller's transaction.

    A lock the transaction does not release (``session``, MariaDB's ``GET_LOCK``) is handed to ``record`` (its
    owner, who releases it) as soon as the server granted it. An interrupt that is not a database error (Ctrl-C, a
    time limit raised by a signal handler) before ``record`` has it may leave a lock granted on the server that no
    one would release: the connection is closed then, inside an ``atomic()`` block too (which then rolls back), and
    the server drops the lock with the session.

    ``unless_held`` (a session-level lock the caller does not hold already): refuse the key when this server session
    holds it, checked in the statement that takes it; then nothing is taken.

    The caller's scope has set the transaction's ``lock_timeout`` (PostgreSQL); MariaDB's ``GET_LOCK`` gets
    ``lock_timeout`` itself. A failure marks the enclosing atomic block for rollback, like any locking failure.
    Its message names the key and the server session(s) holding it: asked on the same connection at once when
    the refusal was not an error (``GET_LOCK`` returning 0, ``pg_try_advisory_*`` returning false); after
    PostgreSQL's expired ``lock_timeout`` (an error: the transaction is aborted) by ``name_holders`` once the
    scope has rolled back.

    Raises:
        LockNotAvailable: with ``nowait``, another session holds the key.
        LockTimeout: the wait for the key took longer than ``lock_timeout``.
        AdvisoryLockAlreadyHeld: with ``unless_held``, this server session already held the key.
        django.db.NotSupportedError: the database has no such advisory lock.
    """
    connection = connections[alias]
    backend = backend_for(connection)
    refused = False  # the database answered "not granted" without an error
    recorded = False
    try:
        with (
            transaction.mark_for_rollback_on_error(using=alias),
            translating(alias, nowait=nowait, attempts=attempts),
        ):
            granted, pid = backend.locks.acquire_advisory(
                connection,
                key,
                shared=shared,
                session=session,
                nowait=nowait,
                timeout=lock_timeout,
                unless_held=unless_held,
            )
            if granted is None:
                raise AdvisoryLockAlreadyHeld(_already_held(alias, key, pid), alias=alias, attempts=attempts)
            if not granted:
                # GET_LOCK returns 0 (and pg_try_advisory_*_lock false) instead of raising: the transaction is
                # intact, so the holder can be asked on the same connection.
                holders = _holders(backend, connection, key, shared=shared)
                refused = True
                if nowait:
                    raise LockNotAvailable(
                        _not_available(alias, key, holders), alias=alias, attempts=attempts
                    )
                raise LockTimeout(
                    _timed_out(alias, key, lock_timeout, holders), alias=alias, attempts=attempts
                )
            held = HeldLock(alias, key, shared, session, pid)
            if record is not None:
                record(held)
                recorded = True
    except LockTimeout as error:
        if not refused:
            # PostgreSQL's lock_timeout (55P03): the server's words say nothing of the key. The transaction is
            # aborted: the holder is asked once the scope has rolled back (name_holders).
            error.args = (_timed_out(alias, key, lock_timeout, None),)
            setattr(error, _PENDING, _Pending(key, shared, lock_timeout))
        raise
    except BaseException as exc:
        if record is not None and not recorded and not isinstance(exc, DatabaseError | LockError):
            _discard_interrupted(alias)
        raise
    return held


def _discard_interrupted(alias: str) -> None:
    """Close the alias's connection so the server ends its session and the lock it may have just granted."""
    connection = connections[alias]
    if connection.connection is None:
        return
    logger.warning(
        "lockkit: an advisory lock on %r was interrupted while being taken; the connection is closed so that a "
        "lock the server may have granted does not outlive the block",
        alias,
    )
    with contextlib.suppress(DatabaseError):
        _discard(connection)


# The attribute of a LockTimeout (lockkit's own error) whose holder is to be named after the rollback.
_PENDING = "_lockkit_advisory_holders_pending"


@dataclass(frozen=True)
class _Pending:
    key: AdvisoryKey
    shared: bool
    lock_timeout: float | None


def name_holders(error: BaseException, alias: str) -> None:
    """Name the holder in ``error``'s message, if it is an advisory ``LockTimeout`` whose scope has ended.

    Called by a scope after its transaction ended (rolled back, or back to its savepoint). Asks only when that is
    safe on the same connection: it is open, not in a failed or doomed transaction; one read of ``pg_locks``
    (no lock taken, so it cannot wait). Never raises: a failure to ask leaves the message as it is.
    """
    pending = getattr(error, _PENDING, None)
    if not isinstance(error, LockTimeout) or not isinstance(pending, _Pending):
        return
    delattr(error, _PENDING)
    connection = connections[alias]
    if connection.connection is None or connection.needs_rollback:
        return
    try:
        holders = backend_for(connection).locks.advisory_holders(
            connection, pending.key, shared=pending.shared
        )
    except DatabaseError:
        logger.debug("lockkit: could not read the holders of advisory lock %s", pending.key, exc_info=True)
        if connection.in_atomic_block:  # the enclosing transaction saw the failed read: it must roll back
            transaction.set_rollback(True, using=alias)
        return
    if holders is not None:
        error.args = (_timed_out(alias, pending.key, pending.lock_timeout, holders),)


def _holders(
    backend: Backend, connection: BaseDatabaseWrapper, key: AdvisoryKey, *, shared: bool
) -> tuple[int, ...] | None:
    try:
        return backend.locks.advisory_holders(connection, key, shared=shared)
    except DatabaseError:  # only for a message: the refusal itself is what the caller raises
        logger.debug("lockkit: could not read the holders of advisory lock %s", key, exc_info=True)
        return None


def _held_by(holders: tuple[int, ...] | None) -> str:
    if holders is None:
        return "held by another session"
    if not holders:
        return "held by another session, which had released it when lockkit looked"
    if len(holders) == 1:
        return f"held by session {holders[0]}"
    return "held by sessions " + ", ".join(str(pid) for pid in holders)


def _not_available(alias: str, key: AdvisoryKey, holders: tuple[int, ...] | None) -> str:
    return f"lock_not_available on database {alias!r}: advisory lock {key} is {_held_by(holders)}"


def _timed_out(
    alias: str, key: AdvisoryKey, lock_timeout: float | None, holders: tuple[int, ...] | None
) -> str:
    within = "the server's lock timeout" if lock_timeout is None else f"{lock_timeout:g}s"
    return (
        f"lock_timeout on database {alias!r}: advisory lock {key} was not granted within {within}: it is "
        f"{_held_by(holders)}"
    )


def _already_held(alias: str, key: AdvisoryKey, pid: int | None) -> str:
    return (
        f"advisory lock {key} on database {alias!r} refused: server session {pid} already holds it, and this block "
        "did not take it: a pooler in transaction mode (PgBouncer pool_mode = transaction) handed this client the "
        "server session on which another client holds the key, where it is re-entrant, so a session-level lock "
        "would exclude nobody; nothing was taken. Use session pooling or a direct connection for this alias, or "
        "session=False"
    )


def give_back(held: HeldLock, *, raise_errors: bool) -> None:
    """Release a lock the transaction does not release by itself (session-level, or MariaDB's ``GET_LOCK``).

    Never leaves the lock on the connection: if the release fails, the connection is closed (the server drops
    every lock of a closed session), inside a transaction too: the release fails there when the transaction is
    already aborted, and a rollback would not release a session-level lock or ``GET_LOCK``. Django then rolls the
    enclosing ``atomic()`` block back (``closed_in_transaction``).

    Args:
        held: The lock, as ``take`` returned it.
        raise_errors: Raise when the release failed or found the lock gone (``False`` while another error is
            already on its way out).

    Raises:
        AdvisoryLockLost: the session no longer held the lock (see the class), or (session-level) the server session
            that took it ended during the block, with ``raise_errors``.
        django.db.DatabaseError: the release failed, with ``raise_errors``; the connection was closed.
    """
    connection = connections[held.alias]
    backend = backend_for(connection)
    try:
        released, pid = backend.locks.release_advisory(connection, held.key, shared=held.shared)
    except DatabaseError as exc:
        # The server session itself is gone (killed, lost, server restarted): it took the lock with it.
        lost = (
            held.session
            and isinstance(exc, OperationalError | InterfaceError)
            and (connection.connection is None or not connection.is_usable())
        )
        _discard(connection)
        logger.warning(
            "lockkit: releasing advisory lock %s on %r failed; connection closed", held.key, held.alias
        )
        if raise_errors and lost:
            raise AdvisoryLockLost(
                f"advisory lock {held.key} on database {held.alias!r} was taken by server session {held.pid}, "
                f"which ended during the block ({type(exc).__name__}: {exc}): the server dropped the lock with "
                "it, so the block did not run under the lock the whole time",
                alias=held.alias,
            ) from exc
        if raise_errors:
            raise
        return
    if released and pid == held.pid:
        return
    logger.warning(
        "lockkit: advisory lock %s on %r was not held by this session any more (taken by %s, released by %s)",
        held.key,
        held.alias,
        held.pid,
        pid,
    )
    if raise_errors:
        raise AdvisoryLockLost(
            f"advisory lock {held.key} on database {held.alias!r} was taken by server session {held.pid} but "
            f"session {pid} ended the block without it: the connection was replaced during the block, or a "
            "pooler in transaction mode (PgBouncer) hands out another server session per transaction; "
            "session=True needs one server session for the whole block",
            alias=held.alias,
        )


def _discard(connection: BaseDatabaseWrapper) -> None:
    # Inside atomic() too: Django marks the block for rollback and forgets the connection at its end.
    connection.close()


__all__ = ["HeldLock", "give_back", "name_holders", "take"]
