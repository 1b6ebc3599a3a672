"""The typed records of lock inspection: a database session, and one session waiting for others' locks.

Plain data, filled by each backend (``lockkit.backends``) and returned by ``lockkit.inspection.blocking()``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: The ``state`` of a blocker that is not a session of the inspected database (another database's: they can meet on
#: a shared catalog; or one that ended meanwhile): only its pid is reported, never its query, user or application.
OTHER_DATABASE = "not a session of this database"


@dataclass(frozen=True)
class Session:
    """One database session, as the server reports it.

    Attributes:
        pid: The session id: PostgreSQL's backend pid, MariaDB/MySQL's connection id.
        application_name: PostgreSQL's ``application_name`` (``None`` on MariaDB/MySQL, which have none).
        user: The database user.
        query: The statement it runs, or (PostgreSQL, idle sessions) the last one it ran; ``None`` when unknown.
        state: What it is doing (``active``, ``idle in transaction``, MariaDB's ``User lock``...).
        transaction_seconds: How long its current transaction has been open, in seconds, or ``None``.
    """

    pid: int
    application_name: str | None = None
    user: str | None = None
    query: str | None = None
    state: str | None = None
    transaction_seconds: float | None = None


@dataclass(frozen=True)
class LockWait:
    """One session waiting for a lock other sessions hold (or queue for ahead of it).

    Attributes:
        alias: The database alias that was inspected.
        waiting: The waiting session.
        blocking: The sessions it waits for directly, as the server reports them (PostgreSQL's
            ``pg_blocking_pids()``: the holders and the sessions queued ahead with a conflicting request).
        lock_kind: What is locked: PostgreSQL's ``locktype`` (``relation``, ``tuple``, ``transactionid``,
            ``advisory``...), InnoDB's ``RECORD``/``TABLE``, or ``user lock`` (MariaDB's ``GET_LOCK``).
        mode: The lock mode requested (``ShareLock``, ``ExclusiveLock``, InnoDB's ``X``...), or ``None``.
        target: The locked relation (``"public"."app_item"``-style name), advisory key or lock name, or ``None``.
        waited_seconds: How long the session has been waiting for this lock, in seconds, or ``None``.
        chain: Session ids from the root blocker (a session that waits for nothing) down to ``waiting``: a waiter
            behind another waiter has a chain of three or more.
    """

    alias: str
    waiting: Session
    blocking: tuple[Session, ...]
    lock_kind: str
    mode: str | None = None
    target: str | None = None
    waited_seconds: float | None = None
    chain: tuple[int, ...] = field(default=())

    @property
    def blocking_pids(self) -> tuple[int, ...]:
        """The ids of the sessions this one waits for directly."""
        return tuple(session.pid for session in self.blocking)

    @property
    def root_pid(self) -> int:
        """The session at the head of the chain: the one every session of the chain waits for, in the end."""
        return self.chain[0] if self.chain else self.waiting.pid

    def as_dict(self) -> dict[str, Any]:
        """Return the record as JSON-ready data (``blocking_pids`` and ``root_pid`` included)."""
        data = asdict(self)
        data["chain"] = list(self.chain)
        data["blocking_pids"] = list(self.blocking_pids)
        data["root_pid"] = self.root_pid
        return data


@dataclass(frozen=True)
class SessionTarget:
    """What the server says of a session about to be cancelled or terminated (``lockkit.inspection``).

    Attributes:
        pid: The session id.
        database: The database it is connected to, or ``None`` (a background process connected to none).
        same_database: Whether that is the inspecting connection's database.
        own: Whether it is the inspecting connection's own session.
        kind: What the process is: PostgreSQL's ``backend_type`` (``client backend``, ``walsender``,
            ``parallel worker``, ``autovacuum worker``, ``checkpointer``...), MariaDB/MySQL's ``COMMAND``
            (``Query``, ``Sleep``, ``Daemon``, ``Binlog Dump``...).
        client: Whether it is a client's session (the only kind lockkit signals).
        known: Whether the server showed what the process is: PostgreSQL hides ``backend_type`` of other roles'
            sessions from a role without ``pg_read_all_stats`` (``kind`` is then ``""``, ``client`` ``False``).
    """

    pid: int
    database: str | None
    same_database: bool
    own: bool
    kind: str
    client: bool
    known: bool = True


__all__ = ["OTHER_DATABASE", "LockWait", "Session", "SessionTarget"]
