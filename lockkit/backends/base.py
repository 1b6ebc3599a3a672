"""The per-vendor interface, with the generic behaviour, in four small parts (as Django's ``DatabaseWrapper``).

A vendor's ``Backend`` holds one object of each part, each a short list of hooks:

    features   what the database can do, as flags and support strings (no SQL but ``server_warnings``)
    tx         a scope's transaction: its opening and timeouts, what to put back, a dead connection, a lost COMMIT
    locks      advisory locks, table locks, bounded lock waits for DDL
    sessions   the server's sessions: ids, who waits for whom, cancelling one, the testing toolkit's SQL

A scope calls four ``tx`` hooks, named after when they run::

    open_transaction        scope entry: BEGIN (or SAVEPOINT when nested)
    apply_timeouts          right after it; returns a TimeoutToken (what to put back) or None
    ... the scope's body ...
    restore_before_release  a nested scope ending without error, before RELEASE SAVEPOINT
    after_transaction_end   after COMMIT, ROLLBACK or RELEASE, with or without error (only with a token)

and two about the connection itself: ``connection_unusable`` (before an outermost scope, only after Django saw
an error) and ``commit_outcome`` (after a connection lost at COMMIT).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import NotSupportedError, connections

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.transaction import Atomic

    from lockkit.advisory.keys import AdvisoryKey
    from lockkit.backends.waits import LockWait, Session, SessionTarget
    from lockkit.tablemodes import TableLockMode


@dataclass(frozen=True)
class ContentionSQL:
    """The SQL the testing toolkit runs on one vendor (``lockkit.testing``): session ids, cancels, lock waits.

    Attributes:
        name: ``"postgresql"``, ``"mariadb"`` or ``"mysql"``.
        session_id: Returns this connection's session id (one row, one column).
        session_exists: Counts the sessions with the id given as the one parameter.
        cancel: Cancels the statement of the session given as the one parameter (the session stays open).
        blocking_edges: Returns ``(waiting session, blocking session)`` rows, one per direct lock wait.
        lock_waits: Returns ``(waiting session, lock kind, holding session or NULL)`` rows for the current
            database's sessions, leaving out the asking session itself.
        min_poll: The shortest useful pause between two reads of the lock-wait views, in seconds.
    """

    name: str
    session_id: str
    session_exists: str
    cancel: str
    blocking_edges: str
    lock_waits: str
    min_poll: float


@dataclass(frozen=True)
class TimeoutToken:
    """What ``apply_timeouts`` changed: each setting's name and the value to put back.

    Attributes:
        previous: The setting names (constants of the backend, never user input) and their enclosing values.
        opened: For an outermost scope, the values (as text) of the backend's ``tx.opening_columns``, read by the
            statement that applied the timeouts, at no extra round trip; empty otherwise.
    """

    previous: Mapping[str, str | float | int]
    opened: tuple[str | None, ...] = ()


class Features:
    """What the database can do: capability flags and support strings, asked before any SQL runs.

    A caller asks ``backend.features.sends_one_message(connection)``, never ``if vendor == ...``.
    """

    #: How messages name the database versions the claims support (``"PostgreSQL"``).
    claims_name: ClassVar[str] = ""
    #: An outermost scope watches its block's failed statements (``execute_wrapper()``) to tell a body that
    #: swallowed one: the driver keeps no aborted-transaction state (``tx.aborted_by``) here.
    watches_failed_statements: ClassVar[bool] = True
    #: Whether a transaction-scoped advisory lock ends with the transaction by itself (PostgreSQL's
    #: ``pg_advisory_xact_lock``); when ``False`` the scope releases it explicitly (MariaDB's ``RELEASE_LOCK``).
    advisory_locks_end_with_transaction: ClassVar[bool] = True
    #: Whether a bound set inside a transaction ends with it by itself (PostgreSQL's ``set_config(..., true)``);
    #: when ``False`` the caller restores it with ``locks.unbound_lock_waits`` on every path.
    lock_waits_bound_end_with_transaction: ClassVar[bool] = False
    #: Whether an outermost scope's transaction itself keeps every other writer out (SQLite's ``BEGIN
    #: IMMEDIATE``): a row read and saved in it needs no row lock, so the unlocked-save check says nothing.
    transaction_locks_database: ClassVar[bool] = False

    def claims_supported(self, connection: BaseDatabaseWrapper) -> bool:
        """Whether this server's version has what lockkit's claims statements need (``lockkit.claims.sql``)."""
        return True

    def timeout_support(self, connection: BaseDatabaseWrapper) -> tuple[str | None, str | None]:
        """Say how a scope's ``lock_timeout`` and ``statement_timeout`` are applied here (``None``: they are not)."""
        return None, None

    def server_warnings(self, connection: BaseDatabaseWrapper) -> list[str]:
        """Return what the server itself says that limits lockkit here (a read-only standby); may connect."""
        return []

    def advisory_support(self, connection: BaseDatabaseWrapper) -> str | None:
        """Say how advisory locks work here, for ``lockkit_capabilities``; ``None`` when lockkit has none."""
        return None

    def table_lock_support(self, connection: BaseDatabaseWrapper) -> str | None:
        """Say how ``LockScope.lock_table`` works here, for ``lockkit_capabilities``; ``None``: it is refused."""
        return None

    def sends_one_message(self, connection: BaseDatabaseWrapper) -> bool:
        """Whether lockkit may send a transaction of its own statements as one message here (no round trip).

        Generic: ``False`` (BEGIN, each statement and COMMIT are sent one by one).
        """
        return False

    def select_for_update_kwargs(
        self, connection: BaseDatabaseWrapper, *, nowait: bool, skip_locked: bool, no_key: bool
    ) -> dict[str, Any]:
        """Return the ``select_for_update()`` keyword arguments for a scope's options.

        Raises:
            NotSupportedError: the database cannot honour an option the scope asked for.
        """
        features = connection.features
        kwargs: dict[str, Any] = {}
        if nowait:
            if not features.has_select_for_update_nowait:
                raise NotSupportedError(
                    f"nowait=True is not supported on {connection.vendor} ({connection.alias!r})"
                )
            kwargs["nowait"] = True
        if skip_locked:
            if not features.has_select_for_update_skip_locked:
                raise NotSupportedError(
                    f"skip_locked=True is not supported on {connection.vendor} ({connection.alias!r})"
                )
            kwargs["skip_locked"] = True
        if no_key:
            if not features.has_select_for_no_key_update:
                raise NotSupportedError(
                    f"no_key=True is not supported on {connection.vendor} ({connection.alias!r})"
                )
            kwargs["no_key"] = True
        if features.has_select_for_update_of:
            # Lock only the queried model's rows: select_related() on a nullable foreign key would otherwise
            # fail (FOR UPDATE cannot apply to the nullable side of an outer join) or lock related rows.
            kwargs["of"] = ("self",)
        return kwargs


class Transactions:
    """A scope's transaction: how it opens and applies its timeouts, what it puts back, and a connection's fate.

    Generic: ``atomic()`` as Django runs it, no timeouts, Django's ``is_usable()``, a lost COMMIT never resolved.
    """

    def open_transaction(
        self,
        connection: BaseDatabaseWrapper,
        atomic: Atomic,
        *,
        lock_timeout: float | None,
        statement_timeout: float | None,
        nested: bool,
    ) -> None:
        """Run at scope entry: begin the scope's transaction or savepoint, ``atomic.__enter__()``.

        A backend overrides this when the transaction must begin differently (SQLite begins it with
        ``BEGIN IMMEDIATE`` so the write lock is taken, and waited for, when the scope begins). If it raises, no
        transaction or savepoint is left open.
        """
        atomic.__enter__()

    def apply_timeouts(
        self,
        connection: BaseDatabaseWrapper,
        *,
        lock_timeout: float | None,
        statement_timeout: float | None,
        nested: bool,
    ) -> TimeoutToken | None:
        """Run right after ``open_transaction``: apply the scope's timeouts.

        Returns:
            What to put back when the scope ends, or ``None`` when nothing needs restoring.
        """
        return None

    def statement_settings(
        self, connection: BaseDatabaseWrapper, *, lock_timeout: float | None, statement_timeout: float | None
    ) -> str | None:
        """The prefix that bounds one statement of lockkit's own by the timeouts, with no session variable changed.

        ``None`` (the default): there is none; lockkit's statements run in a scope that applies the timeouts
        (``apply_timeouts``). An empty string: no timeout to apply.
        """
        return None

    def restore_before_release(self, connection: BaseDatabaseWrapper, token: TimeoutToken) -> None:
        """Run when a nested scope ends without error, before its savepoint is released: restore the timeouts.

        For settings that live in the transaction (PostgreSQL's ``set_config(..., true)``): on error the savepoint
        rollback restores them by itself, and the end of the outermost transaction discards them.
        """

    def after_transaction_end(
        self, connection: BaseDatabaseWrapper, token: TimeoutToken, *, nested: bool
    ) -> None:
        """Run after the scope's COMMIT, ROLLBACK or savepoint RELEASE, with or without error: restore session settings.

        Called only when ``apply_timeouts`` returned a token that is not ``None``, after the commit, the savepoint
        release or the rollback, for nested and outermost scopes alike. For settings a rollback does not revert
        (MySQL's session variables, SQLite's busy timeout), so that no value reaches the next user of the
        connection. An implementation that cannot restore must not leave the altered value behind (close the
        connection when it is outside any transaction).
        """

    def connection_unusable(self, connection: BaseDatabaseWrapper) -> bool:
        """Whether an open connection on which Django saw an error can no longer be used.

        Called before an outermost scope or a claims call, and only when Django recorded an error on the
        connection (``errors_occurred``), so the healthy path never pays for it. Generic: Django's own
        ``is_usable()`` (one round trip, as ``close_if_unusable_or_obsolete()`` does).
        """
        return not connection.is_usable()

    def aborted_by(self, connection: BaseDatabaseWrapper) -> str | None:
        """Whether the connection's transaction was aborted by an error, read locally (no round trip).

        Called before an outermost scope commits, when the body raised nothing: a body that caught a failed
        statement leaves PostgreSQL's transaction aborted, and its COMMIT is answered with ROLLBACK, not an error.

        Returns:
            The server's message of the error that aborted the transaction (``""`` when the driver keeps none), or
            ``None`` when the transaction is not known to be aborted (generic: never known).
        """
        return None

    def cancel_in_flight(self, connection: BaseDatabaseWrapper) -> bool:
        """Cancel the statement still running on the server after an exception interrupted the wait for its reply.

        An exception a signal handler raises (a task runner's time limit, ``SIGALRM``) can leave the driver's wait
        while the server goes on running the statement (and then holds the locks it waited for). Read locally; on
        a statement in flight, a cancel request is sent (no round trip on the connection itself).

        Returns:
            Whether a statement was in flight (and a cancel was sent); generic: never known.
        """
        return False

    def opening_columns(self, connection: BaseDatabaseWrapper) -> tuple[str, ...]:
        """Constant SQL expressions an outermost transaction's opening reads (its id, the server); none here."""
        return ()

    def remember_server(self, connection: BaseDatabaseWrapper, opened: tuple[str | None, ...]) -> None:
        """Keep what ``opening_columns`` read of the server the connection reached (``transaction_server``)."""

    def transaction_id(self, token: TimeoutToken | None) -> int | None:
        """The id of the transaction an outermost scope opened, read by its opening statement; ``None`` here."""
        return None

    def transaction_server(self, connection: BaseDatabaseWrapper) -> Any:
        """The identity of the server the open connection reached, for ``commit_outcome``; ``None`` here."""
        return None

    def commit_outcome(
        self, connection: BaseDatabaseWrapper, xid: int | None, *, within: float, server: Any = None
    ) -> str | None:
        """After the connection was lost while COMMIT was in flight: did transaction ``xid`` commit?

        ``server`` is what ``transaction_server`` said of the transaction's connection: only that server can tell.

        Returns:
            ``"committed"``, ``"aborted"``, or ``None`` when it cannot be known (generic: never).
        """
        return None


class Locks:
    """Locks other than row locks: advisory locks, table locks, and the bound on every lock wait of DDL.

    Generic: every form refused with ``NotSupportedError`` before any SQL runs.
    """

    def check_advisory(self, connection: BaseDatabaseWrapper, *, shared: bool, session: bool) -> None:
        """Refuse, before any SQL runs, an advisory lock the database cannot take.

        Raises:
            NotSupportedError: the database has no such advisory lock.
        """
        raise NotSupportedError(
            f"advisory locks are not supported on {connection.vendor} ({connection.alias!r})"
        )

    def acquire_advisory(
        self,
        connection: BaseDatabaseWrapper,
        key: AdvisoryKey,
        *,
        shared: bool,
        session: bool,
        nowait: bool,
        timeout: float | None,
        unless_held: bool = False,
    ) -> tuple[bool | None, int | None]:
        """Take an advisory lock; return whether it was granted and the server session id that holds it.

        ``False`` means the ``nowait`` attempt found it held, or (MariaDB) the ``timeout`` in seconds expired; a
        database error (PostgreSQL's expired ``lock_timeout``) propagates. Transaction-scoped locks are taken in
        the caller's transaction, whose ``lock_timeout`` the caller has set. With ``unless_held``, ``None`` means
        that this server session already held the key and nothing was taken (checked in the statement that takes
        it, so no other statement of this session can come between).
        """
        self.check_advisory(connection, shared=shared, session=session)
        return False, None  # pragma: no cover - check_advisory raised

    def release_advisory(
        self, connection: BaseDatabaseWrapper, key: AdvisoryKey, *, shared: bool
    ) -> tuple[bool, int | None]:
        """Release one hold of a session-level (MariaDB: any) advisory lock.

        Returns:
            Whether this session held it, and the server session id.
        """
        raise NotSupportedError(
            f"advisory locks are not supported on {connection.vendor} ({connection.alias!r})"
        )

    def advisory_holders(
        self, connection: BaseDatabaseWrapper, key: AdvisoryKey, *, shared: bool
    ) -> tuple[int, ...] | None:
        """The other server sessions holding ``key`` in a mode that excludes a ``shared`` (or exclusive) request.

        For an error message after a request was refused, on the same connection: one short read that takes no
        lock (PostgreSQL ``pg_locks``, MariaDB/MySQL ``IS_USED_LOCK``), so it cannot wait behind the holder.
        ``None`` when it cannot be asked here (no such lock, a closed connection, or (PostgreSQL) the
        connection's transaction has failed).
        """
        return None

    def check_table_lock(self, connection: BaseDatabaseWrapper, mode: TableLockMode) -> None:
        """Refuse, before any SQL runs, a table lock the database cannot hold for the transaction only.

        Raises:
            NotSupportedError: the database has no transaction-scoped table lock in ``mode``.
        """
        raise NotSupportedError(
            f"table locks are not supported on {connection.vendor} ({connection.alias!r}): lockkit takes them "
            "only where they end with the transaction (PostgreSQL's LOCK TABLE)"
        )

    def lock_tables(
        self, connection: BaseDatabaseWrapper, tables: list[str], mode: TableLockMode, *, nowait: bool
    ) -> None:
        """Lock the tables (quoted names, in the order given) in ``mode`` until the transaction ends.

        The wait obeys the transaction's lock timeout; with ``nowait`` a held table fails at once.
        """
        self.check_table_lock(connection, mode)

    def bound_lock_waits(
        self, connection: BaseDatabaseWrapper, lock_timeout: float, *, in_transaction: bool
    ) -> TimeoutToken:
        """Bound the lock waits of the statements that follow (DDL included); return what to restore.

        Transaction-scoped when ``in_transaction`` where the database has such a form, else session-scoped: the
        caller restores it with ``unbound_lock_waits`` on every path (``features.lock_waits_bound_end_with_transaction``
        says when it need not).

        Raises:
            NotSupportedError: lockkit cannot bound lock waits on this database.
        """
        raise NotSupportedError(f"lock waits cannot be bounded on {connection.vendor} ({connection.alias!r})")

    def unbound_lock_waits(self, connection: BaseDatabaseWrapper, token: TimeoutToken) -> None:
        """Put back what ``bound_lock_waits`` changed.

        If that fails outside a transaction, close the connection (so the altered value cannot reach the next user
        of it) and raise.
        """


class Sessions:
    """The server's sessions: their ids, who waits for whom, signalling one, and the testing toolkit's SQL.

    Generic: a session id is never known, and inspecting or signalling sessions is refused.
    """

    def local_session_id(self, connection: BaseDatabaseWrapper) -> int | None:
        """The server session id of the open connection, read from the driver (no round trip); ``None`` here."""
        return None

    def session_pid(self, connection: BaseDatabaseWrapper) -> int:
        """The server session id of ``connection`` (connects), for ``lockkit.prioritize``."""
        self.check_prioritize(connection)
        raise AssertionError  # pragma: no cover - check_prioritize raised

    def session_database(self, connection: BaseDatabaseWrapper, pid: int) -> tuple[str | None, bool, bool]:
        """Say which database session ``pid`` is connected to.

        Returns:
            Its database (``None``: no such session), whether that is the connection's own database, and whether
            ``pid`` is the connection's own session.
        """
        raise NotSupportedError(f"sessions cannot be inspected on {connection.vendor} ({connection.alias!r})")

    def session_ended(self, connection: BaseDatabaseWrapper, pid: int) -> bool | None:
        """Whether server session ``pid`` is gone or idle (its transaction over), asked on ``connection``.

        For resolving a message or statement whose reply was lost (claims, an enqueue); ``pid`` is the id
        ``local_session_id()`` read from the driver. ``None`` when it cannot be known: the server session
        ``connection`` reaches is not the one its driver names (a connection pooler in between, which hands out
        ids of its own), or the backend cannot say. Generic: ``None``.
        """
        return None

    def server_statement_timeout(self, connection: BaseDatabaseWrapper) -> float | None:
        """The statement timeout a new session starts with, in seconds (role, database, options); ``None``: none."""
        return None

    def lock_waits(self, connection: BaseDatabaseWrapper, alias: str) -> list[LockWait]:
        """Return the sessions of the connection's database waiting for locks, with their direct blockers.

        Raises:
            NotSupportedError: lockkit cannot inspect locks on this database.
        """
        raise NotSupportedError(f"lock inspection is not supported on {connection.vendor} ({alias!r})")

    def signal_target(self, connection: BaseDatabaseWrapper, pid: int) -> SessionTarget | None:
        """Say what session ``pid`` is (its database, whether it is a client's session), or ``None``: none such.

        Raises:
            NotSupportedError: lockkit cannot inspect sessions on this database.
        """
        raise NotSupportedError(f"sessions cannot be inspected on {connection.vendor} ({connection.alias!r})")

    def signal_session(self, connection: BaseDatabaseWrapper, pid: int, *, terminate: bool) -> bool:
        """Cancel session ``pid``'s statement, or terminate the session; return whether the signal was sent.

        Only a client session of the connection's database is signalled, where the database can check it in the
        signalling statement itself (PostgreSQL); the caller checks it first (``signal_target``) in any case.
        """
        raise NotSupportedError(f"sessions cannot be signalled on {connection.vendor} ({connection.alias!r})")

    def cancel_statement(self, alias: str, session: int) -> None:
        """Cancel what session ``session`` of ``alias`` runs now, from a connection of its own.

        Called from another thread than the session's (an awaiting caller was cancelled: ``lockkit.cancellation``).

        Raises:
            django.db.NotSupportedError: the vendor has no way to signal a session.
        """
        control = connections.create_connection(alias)
        try:
            self.signal_session(control, session, terminate=False)
        finally:
            control.close()

    def check_prioritize(self, connection: BaseDatabaseWrapper) -> None:
        """Refuse, before any SQL runs, ``lockkit.prioritize`` where lockkit cannot see who blocks a session.

        Raises:
            NotSupportedError: always, here.
        """
        raise NotSupportedError(
            f"lockkit.prioritize is not supported on {connection.vendor} ({connection.alias!r}): it is "
            "PostgreSQL only (pg_blocking_pids)"
        )

    def client_blockers(self, connection: BaseDatabaseWrapper, pid: int, *, waited: float) -> list[Session]:
        """The client sessions of the connection's database that block session ``pid``.

        Only once ``pid`` has waited at least ``waited`` seconds for its current lock; else none.
        """
        self.check_prioritize(connection)
        raise AssertionError  # pragma: no cover - check_prioritize raised

    def contention_sql(self, connection: BaseDatabaseWrapper) -> ContentionSQL:
        """The SQL ``lockkit.testing`` runs here: session ids, cancels, who waits for whom.

        Raises:
            NotImplementedError: the toolkit cannot observe sessions on this database.
        """
        raise NotImplementedError(
            f"the contention toolkit does not support {connection.vendor} ({connection.alias!r}): it needs "
            "PostgreSQL or MariaDB/MySQL, whose sessions can wait for each other's row locks"
        )


#: The components of a backend: attribute name -> the generic class every vendor's part subclasses.
COMPONENTS: Mapping[str, type] = {
    "features": Features,
    "tx": Transactions,
    "locks": Locks,
    "sessions": Sessions,
}


class Backend:
    """One vendor's hooks, composed of small parts, as Django's ``DatabaseWrapper`` holds ``features``, ``ops``...

    The generic backend (a vendor lockkit has no special support for) is this class itself. A vendor subclasses it
    and names its own part classes; each part is built once, with the backend.

    Attributes:
        features: Capability flags and support strings (``Features``).
        tx: A scope's transaction: opening, timeouts, restoring, a dead connection, a lost COMMIT (``Transactions``).
        locks: Advisory locks, table locks, bounded lock waits (``Locks``).
        sessions: Session ids, lock waits, signalling, the testing toolkit's SQL (``Sessions``).
    """

    features_class: ClassVar[type[Features]] = Features
    transactions_class: ClassVar[type[Transactions]] = Transactions
    locks_class: ClassVar[type[Locks]] = Locks
    sessions_class: ClassVar[type[Sessions]] = Sessions

    def __init__(self) -> None:
        """Build one object of each part (they hold no state: one backend serves every connection of its vendor)."""
        self.features = self.features_class()
        self.tx = self.transactions_class()
        self.locks = self.locks_class()
        self.sessions = self.sessions_class()
