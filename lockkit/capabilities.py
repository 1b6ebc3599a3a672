"""What lockkit can do on each configured database, and where its correctness depends on configuration.

Read by the system checks (``lockkit.system_checks``) and the ``lockkit_capabilities`` management command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from lockkit.backends import backend_for, has_backend
from lockkit.scopes.aliases import check_alias
from lockkit.scopes.options import ScopeOptions

# Default ports of common connection poolers: PgBouncer, Pgpool-II, ProxySQL, MaxScale (readwritesplit).
_POOLER_PORTS = {6432: "PgBouncer", 9999: "Pgpool-II", 6033: "ProxySQL", 4006: "MaxScale"}
_POOLER_WORDS = ("pgbouncer", "pooler", "pgpool", "proxysql", "maxscale", "odyssey", "pgcat", "supavisor")


@dataclass(frozen=True)
class Capabilities:
    """What lockkit can do on one database alias.

    Attributes:
        alias: The database alias.
        vendor: Django's vendor name (``postgresql``, ``mysql``, ``sqlite``, ``oracle``, ...).
        row_locks: ``SELECT ... FOR UPDATE`` exists (SQLite: no; lockkit locks the whole database instead).
        nowait, skip_locked, of, no_key: The ``select_for_update`` options the database honours.
        lock_timeout, statement_timeout: How lockkit applies the scope's timeouts, or ``None`` when it cannot.
        advisory_locks: How ``advisory_lock()`` works here, or ``None`` when it is not supported.
        table_locks: How ``LockScope.lock_table()`` works here, or ``None`` when it is refused.
        warnings: Where correctness depends on configuration.
        error: Why the server could not be asked (the flags that need it are then ``False``), or ``None``.
    """

    alias: str
    vendor: str
    row_locks: bool = False
    nowait: bool = False
    skip_locked: bool = False
    of: bool = False
    no_key: bool = False
    lock_timeout: str | None = None
    statement_timeout: str | None = None
    advisory_locks: str | None = None
    table_locks: str | None = None
    warnings: tuple[str, ...] = field(default=())
    error: str | None = None


def pooler(settings_dict: dict[str, Any]) -> str | None:
    """Say why a database's settings look like a connection pooler (its port or host name), or ``None``."""
    try:
        port = int(settings_dict.get("PORT") or 0)
    except (TypeError, ValueError):
        port = 0
    if port in _POOLER_PORTS:
        return f"{_POOLER_PORTS[port]}'s default port {port}"
    host = str(settings_dict.get("HOST") or "").lower()
    word = next((w for w in _POOLER_WORDS if w in host), None)
    return f"host {host!r}" if word else None


_LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}


def topology_warnings(alias: str) -> list[str]:
    """Warnings about how a PostgreSQL alias survives a failover or a dead peer; needs no connection.

    A multi-host alias (``HOST="h1,h2"``) without ``target_session_attrs=read-write`` (or ``primary``) can reconnect
    to the old primary after a switchover, now a read-only standby; a remote alias with no bound on a peer that stops
    answering (``tcp_user_timeout``, ``keepalives_idle``) can wait on a dead socket forever. See
    https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS.
    """
    check_alias(alias)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    settings_dict = connection.settings_dict
    options = settings_dict.get("OPTIONS") or {}
    hosts = [
        h.strip().lower() for h in str(settings_dict.get("HOST") or options.get("host") or "").split(",")
    ]
    warnings: list[str] = []
    attrs = str(options.get("target_session_attrs") or "any").lower()
    if len(hosts) > 1 and attrs not in {"read-write", "primary"}:
        warnings.append(
            f"{alias!r} lists several hosts ({', '.join(hosts)}) without OPTIONS['target_session_attrs'] = "
            "'read-write': after a switchover a reconnect may reach the old primary, now a read-only standby, and "
            "every locked call fails with ReadOnlyDatabase"
        )
    remote = [
        h for h in hosts if h not in _LOCAL_HOSTS and not h.startswith("/") and not h.startswith("127.")
    ]
    if remote and not any(options.get(key) for key in ("tcp_user_timeout", "keepalives_idle")):
        warnings.append(
            f"{alias!r} reaches {', '.join(remote)} with no bound on a peer that stops answering (a network cut "
            "without a reset, a failed-over address): a statement, a COMMIT or a lock wait then waits on a dead "
            "socket for hours; set OPTIONS['tcp_user_timeout'] (milliseconds) and OPTIONS['keepalives_idle'], "
            "['keepalives_interval'], ['keepalives_count'] (seconds)"
        )
    return warnings


def configuration_warnings(alias: str) -> list[str]:
    """Return warnings about the settings of ``alias`` lockkit's guarantees depend on; needs no connection."""
    check_alias(alias)
    connection = connections[alias]
    settings_dict = connection.settings_dict
    options = settings_dict.get("OPTIONS") or {}
    warnings: list[str] = []
    if not has_backend(connection.vendor):
        warnings.append(
            f"lockkit has no backend for {connection.vendor!r}: row locks follow Django's feature flags, but "
            "lock_timeout and statement_timeout are not applied, so a lock wait is bounded only by the server"
        )
    if connection.vendor == "sqlite" and str(options.get("transaction_mode") or "").upper() not in {
        "IMMEDIATE",
        "EXCLUSIVE",
    }:
        context = (
            "every request runs in one (ATOMIC_REQUESTS=True)" if settings_dict.get("ATOMIC_REQUESTS") else ""
        )
        warnings.append(
            "SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE': a locked scope begins with "
            "BEGIN IMMEDIATE itself, but one nested in a plain atomic() runs inside a deferred transaction "
            "that cannot take the "
            "write lock in time and may fail at once with 'database is locked'"
            + (f"; {context}" if context else "")
        )
    found_pooler = pooler(settings_dict)
    if found_pooler is not None:
        advice = (
            "lockkit's PostgreSQL timeouts are transaction-scoped and safe in transaction pooling; "
            "in session "
            "pooling, any session-level SET your own code runs passes to the next client. With transaction "
            "pooling set DISABLE_SERVER_SIDE_CURSORS = True (and OPTIONS['prepare_threshold'] = None before "
            "PgBouncer 1.21)"
            if connection.vendor == "postgresql"
            else "lockkit restores the session variables it sets at the end of each scope, which needs "
            "the same "
            "server session for the whole transaction: use session pooling, or multiplexing that keeps a "
            "transaction on one backend"
        )
        # A session-level advisory lock lives on the server session that took it.
        advice += (
            "; advisory_lock(session=True) needs one server session for the whole block, which transaction "
            "pooling does not give (lockkit refuses it with AdvisoryLockAlreadyHeld when the server session it gets "
            "already holds the key, and raises AdvisoryLockLost at the end when another session releases it)"
        )
        warnings.append(f"{alias!r} looks like it is behind a connection pooler ({found_pooler}): {advice}")
        if connection.vendor == "postgresql" and not settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
            warnings.append(
                f"{alias!r} is behind a pooler without DISABLE_SERVER_SIDE_CURSORS = True: "
                ".iterator() breaks "
                "under transaction pooling"
            )
    return warnings


def _in_memory(name: object) -> bool:
    text = str(name or "")
    return text in ("", ":memory:") or "mode=memory" in text


def memory_database_warnings(alias: str) -> list[str]:
    """Warn about an in-memory SQLite database or test database on ``alias``; needs no connection.

    Django makes a SQLite test database in memory unless ``TEST["NAME"]`` is set; its connections share one page
    cache, whose table locks are never waited for: a contended scope fails at once with "database table is
    locked" (``LockNotAvailable``) instead of waiting its lock timeout.
    """
    check_alias(alias)
    connection = connections[alias]
    if connection.vendor != "sqlite":
        return []
    settings_dict = connection.settings_dict
    warnings: list[str] = []
    if _in_memory(settings_dict.get("NAME")):
        warnings.append(
            f"{alias!r} is an in-memory SQLite database: each connection gets its own database (or, with a "
            "shared cache, table locks that are never waited for); lockkit's lock waits need a file database"
        )
    elif _in_memory((settings_dict.get("TEST") or {}).get("NAME")):
        warnings.append(
            f"the test database of {alias!r} is an in-memory SQLite database (Django's default for SQLite): its "
            "connections share one cache whose table locks are never waited for, so contention tests fail at "
            "random with 'database table is locked'; set TEST['NAME'] to a file"
        )
    return warnings


def capabilities(alias: str) -> Capabilities:
    """Return what lockkit can do on ``alias``. Connects to ask the server (version, read-only state).

    Raises:
        TypeError, ValueError: ``alias`` is not a configured database alias.
    """
    warnings = tuple(configuration_warnings(alias)) + tuple(memory_database_warnings(alias))
    connection = connections[alias]
    backend = backend_for(connection)
    try:
        features = connection.features
        lock_timeout, statement_timeout = backend.features.timeout_support(connection)
        warnings += tuple(backend.features.server_warnings(connection))
        warnings += tuple(statement_timeout_warnings(alias))
        return Capabilities(
            alias=alias,
            vendor=connection.vendor,
            row_locks=bool(features.has_select_for_update),
            nowait=bool(features.has_select_for_update_nowait),
            skip_locked=bool(features.has_select_for_update_skip_locked),
            of=bool(features.has_select_for_update_of),
            no_key=bool(features.has_select_for_no_key_update),
            lock_timeout=lock_timeout,
            statement_timeout=statement_timeout,
            advisory_locks=backend.features.advisory_support(connection),
            table_locks=backend.features.table_lock_support(connection),
            warnings=warnings,
        )
    except Exception as exc:  # an unreachable server must not break the report of the others
        return Capabilities(alias=alias, vendor=connection.vendor, warnings=warnings, error=f"{exc}".strip())


def statement_timeout_warnings(alias: str) -> list[str]:
    """A server-side statement timeout shorter than the scopes' lock timeout ends their lock waits first.

    Asks the server (one query) what statement timeout a session starts with; compares it with
    ``settings.LOCKKIT["LOCK_TIMEOUT"]`` unless ``STATEMENT_TIMEOUT`` is set (scopes then set their own).
    """
    connection = connections[alias]
    server = backend_for(connection).sessions.server_statement_timeout(connection)
    lock_timeout, statement_timeout = ScopeOptions().timeouts()
    if server is None or lock_timeout is None or statement_timeout is not None or server >= lock_timeout:
        return []
    return [
        f"{alias!r} starts its sessions with a statement timeout of {server:g} s (a role or database setting, the "
        f"connection's options, the platform's default), shorter than lockkit's lock_timeout of {lock_timeout:g} s: "
        "a lock wait ends as StatementTimeout before it can end as a (retried) LockTimeout; lower LOCK_TIMEOUT or "
        "set STATEMENT_TIMEOUT in settings.LOCKKIT"
    ]


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def format_table(caps: Capabilities) -> str:
    """Render one alias's capabilities as a plain-text table."""
    rows: list[tuple[str, str]] = [
        (
            "row locks (SELECT ... FOR UPDATE)",
            _yes(caps.row_locks)
            if caps.vendor != "sqlite"
            else "no: BEGIN IMMEDIATE locks the whole database",
        ),
        ("nowait (NOWAIT)", _yes(caps.nowait)),
        ("skip_locked (SKIP LOCKED)", _yes(caps.skip_locked)),
        (
            'of=("self",) (FOR UPDATE OF)',
            _yes(caps.of) + ("" if caps.of else ": related rows are locked too"),
        ),
        ("no_key (FOR NO KEY UPDATE)", _yes(caps.no_key)),
        ("lock_timeout", caps.lock_timeout or "not applied"),
        ("statement_timeout", caps.statement_timeout or "not supported"),
        ("advisory locks", caps.advisory_locks or "not supported"),
        ("table locks (lock_table)", caps.table_locks or "not supported"),
    ]
    if caps.error is not None:
        rows = [("server", f"unreachable: {caps.error}")]
    width = max(len(name) for name, _ in rows)
    lines = [f"{caps.alias} ({caps.vendor})"]
    lines += [f"  {name.ljust(width)}  {value}" for name, value in rows]
    lines += [f"  warning: {warning}" for warning in caps.warnings]
    return "\n".join(lines)


__all__ = [
    "Capabilities",
    "capabilities",
    "configuration_warnings",
    "format_table",
    "memory_database_warnings",
    "pooler",
    "statement_timeout_warnings",
    "topology_warnings",
]
