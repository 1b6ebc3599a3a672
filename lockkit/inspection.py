"""Lock inspection for production incidents: who waits for whom, transitively, and cancelling a blocker.

``blocking()`` reads ``pg_locks`` + ``pg_blocking_pids()`` on PostgreSQL and the InnoDB lock-wait tables plus
``GET_LOCK`` waits on MariaDB/MySQL, over a fresh connection; ``manage.py lockkit_locks`` prints it as a tree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from lockkit.backends import backend_for
from lockkit.backends.waits import LockWait, Session, SessionTarget
from lockkit.errorcodes.table import code_of
from lockkit.scopes.aliases import check_alias


def blocking(using: str | None = None) -> list[LockWait]:
    """Return every session of the alias's database that waits for a lock, with whom it waits for.

    Each ``LockWait`` names the waiting session and the sessions blocking it directly (pid, query, application
    name, transaction age), the lock's kind, mode and target (relation, advisory key, ``GET_LOCK`` name), how long
    it has waited, and its ``chain`` from the root blocker: with a holder H, a waiter A behind H and a waiter B
    behind A, B's chain is ``(H, A, B)``. Asked over a fresh connection (the caller's own session and
    transaction are never part of the answer). Sessions of other databases on the same server are left out. See
    https://www.postgresql.org/docs/current/view-pg-locks.html and
    https://mariadb.com/kb/en/information-schema-innodb_lock_waits-table/.

    Args:
        using: The database alias (default ``"default"``).

    Returns:
        The waits, ordered by chain (root first) then waiting pid.

    Raises:
        TypeError, ValueError: ``using`` is not a configured alias.
        django.db.NotSupportedError: the database is neither PostgreSQL nor MariaDB/MySQL.
    """
    alias = check_alias(using if using is not None else DEFAULT_DB_ALIAS)
    connection = connections.create_connection(alias)
    try:
        waits = backend_for(connection).sessions.lock_waits(connection, alias)
    finally:
        connection.close()
    return with_chains(waits)


def with_chains(waits: list[LockWait]) -> list[LockWait]:
    """Fill each wait's ``chain``, from the root blocker down to the waiter.

    From the waiter, follow the blocker that is itself waiting (the session queued ahead), else the first blocker,
    up to a session that waits for nothing (or around a deadlock's cycle, once).

    Args:
        waits: The waits, as a backend reports them.

    Returns:
        The same waits with ``chain`` set, ordered by chain then waiting pid.
    """
    by_waiter = {wait.waiting.pid: wait for wait in waits}

    def parent(wait: LockWait) -> int | None:
        waiting_blockers = [pid for pid in wait.blocking_pids if pid in by_waiter and pid != wait.waiting.pid]
        if waiting_blockers:
            return waiting_blockers[0]
        return wait.blocking_pids[0] if wait.blocking_pids else None

    chained = []
    for wait in waits:
        path = [wait.waiting.pid]
        current: LockWait | None = wait
        while current is not None:
            up = parent(current)
            if up is None or up in path:
                break
            path.append(up)
            current = by_waiter.get(up)
        chained.append(dataclasses.replace(wait, chain=tuple(reversed(path))))
    return sorted(chained, key=lambda wait: (wait.chain, wait.waiting.pid))


def roots(waits: list[LockWait]) -> list[Session]:
    """The sessions at the head of the chains: each blocks others and waits for nothing itself."""
    waiting = {wait.waiting.pid for wait in waits}
    found: dict[int, Session] = {}
    for wait in waits:
        for session in wait.blocking:
            if session.pid not in waiting:
                found.setdefault(session.pid, session)
    return [found[pid] for pid in sorted(found)]


@dataclass(frozen=True)
class Signalled:
    """What ``cancel()``/``terminate()`` did.

    Attributes:
        alias: The database alias.
        pid: The session signalled.
        action: ``"cancel"`` (its current statement) or ``"terminate"`` (the whole session).
        sent: Whether the server accepted the signal (``False``: the session ended meanwhile).
        database: The database the session was connected to.
    """

    alias: str
    pid: int
    action: Literal["cancel", "terminate"]
    sent: bool
    database: str

    def __str__(self) -> str:
        """Say what was done, in a sentence for people."""
        what = "cancelled the statement of" if self.action == "cancel" else "terminated"
        if not self.sent:
            return f"session {self.pid} on database {self.database!r} ({self.alias!r}) was not signalled: it ended"
        return f"{what} session {self.pid} on database {self.database!r} ({self.alias!r})"


class SignalNotPermitted(DatabaseError):
    """This database user may not signal the session, or may not check what it is; nothing was signalled.

    Raised when the database refuses the signal (PostgreSQL SQLSTATE 42501: a non-superuser signalling a
    superuser's session, or another role's without ``pg_signal_backend``; MariaDB/MySQL error 1095: another user's
    session without ``CONNECTION ADMIN`` or ``SUPER``), raised from the database's error; and, with ``code``
    ``None``, before any signal when PostgreSQL hides what the session is (another role's ``backend_type``,
    without ``pg_read_all_stats``): lockkit signals only sessions it has checked are clients'. A
    ``django.db.DatabaseError``.

    Attributes:
        alias: The database alias.
        pid: The session that was not signalled.
        action: ``"cancel"`` or ``"terminate"``.
        code: The SQLSTATE or vendor error code, or ``None`` when lockkit refused before signalling.
    """

    def __init__(
        self, alias: str, pid: int, action: Literal["cancel", "terminate"], code: str | None, reason: str = ""
    ) -> None:
        """Record what was refused, with a message for people."""
        self.alias, self.pid, self.action, self.code = alias, pid, action, code
        if not reason:
            reason = (
                f"database error {code}: the database user may not signal that session (PostgreSQL: a "
                "superuser's session, or another role's without pg_signal_backend; MariaDB/MySQL: another "
                "user's session without CONNECTION ADMIN or SUPER)"
            )
        super().__init__(
            f"not permitted to {action} session {pid} on {alias!r} ({reason}); nothing was signalled"
        )


# The codes a refused signal carries: insufficient_privilege, MariaDB/MySQL's ER_KILL_DENIED_ERROR and
# ER_SPECIFIC_ACCESS_DENIED_ERROR.
_NOT_PERMITTED = frozenset({"42501", "1095", "1227"})


def _refusal(target: SessionTarget, alias: str) -> str | None:
    """Why ``target`` may not be signalled, or ``None`` when it may."""
    if target.own:  # pragma: no cover - the fresh connection's own id is never known to the caller
        return f"session {target.pid} is lockkit's own inspection session"
    if not target.client:
        return (
            f"session {target.pid} is a {target.kind or 'server process'!r}, not a client's session: lockkit "
            "signals client sessions only (never a walsender, replication thread or background worker)"
        )
    if not target.same_database:
        return (
            f"session {target.pid} is connected to database {target.database!r}, not to the database of "
            f"{alias!r}: refusing to signal a session of another database"
        )
    return None


def _checked(connection: Any, alias: str, pid: int, action: Literal["cancel", "terminate"]) -> SessionTarget:
    """Check in one statement that ``pid`` is a client session of the alias's database; raise if not."""
    target = backend_for(connection).sessions.signal_target(connection, pid)
    if target is None:
        raise ValueError(f"no session {pid} on the server of {alias!r}: nothing was signalled")
    if not target.known:
        raise SignalNotPermitted(
            alias,
            pid,
            action,
            None,
            "this database user may not see what the session is: PostgreSQL shows another role's "
            "backend_type only to members of pg_read_all_stats, and lockkit signals only sessions it has "
            "checked are clients'",
        )
    refusal = _refusal(target, alias)
    if refusal is not None:
        raise ValueError(f"{refusal}; nothing was signalled")
    return target


def _arguments(pid: int, using: str | None) -> str:
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise TypeError(f"pid must be an int, not {type(pid).__name__}")
    if pid <= 0:
        raise ValueError(f"pid must be a positive session id, got {pid}")
    return check_alias(using if using is not None else DEFAULT_DB_ALIAS)


def check_signal(
    pid: int, *, using: str | None = None, action: Literal["cancel", "terminate"] = "terminate"
) -> SessionTarget:
    """Say whether ``cancel()``/``terminate()`` would signal session ``pid``, without signalling it.

    The same check they make first (a client's session of the alias's database), for a confirmation prompt
    (``manage.py lockkit_locks``). The session may still end, or be refused by the database's privileges, when
    it is signalled.

    Args:
        pid: The session id, as ``blocking()`` reports it.
        using: The database alias (default ``"default"``).
        action: What the caller means to do, for the messages.

    Returns:
        What the server says of the session.

    Raises:
        TypeError, ValueError, SignalNotPermitted: as ``cancel()``/``terminate()`` would, before any signal;
            ``ValueError`` also when ``action`` is neither ``"cancel"`` nor ``"terminate"``.
        django.db.NotSupportedError: the database is neither PostgreSQL nor MariaDB/MySQL.
    """
    if action not in ("cancel", "terminate"):
        raise ValueError(f"action must be 'cancel' or 'terminate', got {action!r}")
    alias = _arguments(pid, using)
    connection = connections.create_connection(alias)
    try:
        return _checked(connection, alias, pid, action)
    finally:
        connection.close()


def _signal(pid: int, using: str | None, *, terminate: bool) -> Signalled:
    alias = _arguments(pid, using)
    action: Literal["cancel", "terminate"] = "terminate" if terminate else "cancel"
    connection = connections.create_connection(alias)
    try:
        # Two statements: check the session, then signal it (PostgreSQL's signalling statement checks again).
        target = _checked(connection, alias, pid, action)
        try:
            sent = backend_for(connection).sessions.signal_session(connection, pid, terminate=terminate)
        except DatabaseError as exc:
            code = code_of(exc)
            if code in _NOT_PERMITTED:
                raise SignalNotPermitted(alias, pid, action, str(code)) from exc
            raise
    finally:
        connection.close()
    return Signalled(alias, pid, action, sent, target.database or "")


def cancel(pid: int, *, using: str | None = None) -> Signalled:
    """Cancel the statement session ``pid`` runs (``pg_cancel_backend`` / ``KILL QUERY``); its session stays.

    Its transaction fails (PostgreSQL: SQLSTATE 57014; the session must roll back), so its locks are released when
    it rolls back. Only a client's session of the alias's database is signalled: the session is checked in one
    statement (``pg_stat_activity.backend_type = 'client backend'`` and its database; MariaDB/MySQL: not a server
    thread such as replication or the event scheduler), then signalled in another (which, on PostgreSQL, checks
    again). See https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADMIN-SIGNAL.

    Args:
        pid: The session id, as ``blocking()`` reports it.
        using: The database alias (default ``"default"``).

    Returns:
        A ``Signalled`` record saying what was done; ``sent`` is ``False`` when the session ended between the check
        and the signal (or, PostgreSQL, its pid now belongs to a process that may not be signalled).

    Raises:
        TypeError: ``pid`` is not an ``int``.
        ValueError: ``pid`` is not positive, no such session exists (MariaDB/MySQL without ``PROCESS``: none of
            this user's), it is not a client's session (a walsender, a background worker, a server thread), or it
            belongs to another database. Nothing was signalled.
        SignalNotPermitted: the database refused (PostgreSQL SQLSTATE 42501, MariaDB/MySQL error 1095): this
            database user may not signal that session; or (``code`` ``None``) it may not see what the session
            is (PostgreSQL: another role's, without ``pg_read_all_stats``). Nothing was signalled.
        django.db.NotSupportedError: the database is neither PostgreSQL nor MariaDB/MySQL.
    """
    return _signal(pid, using, terminate=False)


def terminate(pid: int, *, using: str | None = None) -> Signalled:
    """Terminate session ``pid`` (``pg_terminate_backend`` / ``KILL CONNECTION``), releasing all its locks.

    Its transaction rolls back and every lock it holds, advisory locks included, is released. Only a client's
    session of the alias's database is signalled, checked as ``cancel()`` does: never a walsender, a replication
    thread, a parallel or autovacuum worker, nor a session of another database on the same server. See
    https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADMIN-SIGNAL.

    Args:
        pid: The session id, as ``blocking()`` reports it.
        using: The database alias (default ``"default"``).

    Returns:
        A ``Signalled`` record saying what was done; ``sent`` is ``False`` when the session ended between the check
        and the signal (or, PostgreSQL, its pid now belongs to a process that may not be signalled).

    Raises:
        TypeError: ``pid`` is not an ``int``.
        ValueError: ``pid`` is not positive, no such session exists (MariaDB/MySQL without ``PROCESS``: none of
            this user's), it is not a client's session (a walsender, a background worker, a server thread), or it
            belongs to another database. Nothing was signalled.
        SignalNotPermitted: the database refused (PostgreSQL SQLSTATE 42501, MariaDB/MySQL error 1095): this
            database user may not signal that session; or (``code`` ``None``) it may not see what the session
            is (PostgreSQL: another role's, without ``pg_read_all_stats``). Nothing was signalled.
        django.db.NotSupportedError: the database is neither PostgreSQL nor MariaDB/MySQL.
    """
    return _signal(pid, using, terminate=True)


__all__ = [
    "LockWait",
    "Session",
    "SessionTarget",
    "SignalNotPermitted",
    "Signalled",
    "blocking",
    "cancel",
    "check_signal",
    "roots",
    "terminate",
    "with_chains",
]
