"""The table of SQLSTATEs and vendor error numbers lockkit classifies, reading codes off exception chains, ``classify``.

The table is data, one row per (vendor, code); ``lookup()`` is its only reader. ``classify()`` here is pure: it
knows nothing about scopes (the public ``lockkit.classify`` adds "the innermost scope's ``nowait``"). This module
imports nothing from lockkit but ``lockkit.errors``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lockkit.errors import Failure, LockError

# How many links of __cause__/__context__ to follow: Django wraps once, TransactionManagementError once more,
# user code may wrap a few times; a bound keeps a pathological chain cheap.
_MAX_CHAIN = 32


@dataclass(frozen=True)
class CodeRow:
    """One classified code.

    Attributes:
        vendor: ``"postgresql"`` (SQLSTATE, also CockroachDB), ``"mysql"`` (MySQL and MariaDB error numbers),
            ``"sqlite"`` (extended result codes) or ``"oracle"`` (ORA- numbers).
        code: The code as a string (``"55P03"``, ``"1213"``).
        name: The condition name the vendor gives it.
        failure: The lockkit failure kind.
        ambiguous_nowait: The code means "NOWAIT failed" or "lock wait timed out" depending on the statement.
        ambiguous_timeout: The code means "cancelled" or "statement timeout" depending on whether a statement
            timeout was set for the statement (PostgreSQL's 57014).
        hint: What the code means in practice and what to do, appended to the typed error's message (or ``""``).
    """

    vendor: str
    code: str
    name: str
    failure: Failure
    ambiguous_nowait: bool = False
    ambiguous_timeout: bool = False
    hint: str = ""


# SQLITE_LOCKED is a conflict inside one shared page cache (Django's in-memory SQLite test database shares one
# between its connections): the busy timeout does not apply to it, so nothing waited.
_SHARED_CACHE_HINT = (
    "SQLite reports a table lock held by another connection to the same shared-cache database (Django's in-memory "
    "SQLite test database is one); shared-cache locks are never waited for, whatever the lock timeout. Use a file "
    "database: set DATABASES[alias]['TEST']['NAME'] (and NAME) to a file path"
)


# The refusals of a connection's settings: the same settings are refused again, however long one waits.
_SETTINGS_HINT = (
    "the server refused the connection's settings (DATABASES[alias] NAME, USER or PASSWORD): a lockkit call does "
    "not retry this, as the server refuses the same settings until they, the database or the role change (a "
    "running lockkit_worker waits for that). Fix the settings, or create the database or role"
)


CODES: tuple[CodeRow, ...] = (
    # PostgreSQL: https://www.postgresql.org/docs/current/errcodes-appendix.html. CockroachDB reports the same
    # SQLSTATEs through psycopg: 40001 for every transaction restart (RETRY_SERIALIZABLE, RETRY_WRITE_TOO_OLD,
    # ABORT_REASON_*...), 55P03 for NOWAIT and lock_timeout, 57014 for statement_timeout.
    # https://www.cockroachlabs.com/docs/stable/transaction-retry-error-reference
    CodeRow("postgresql", "55P03", "lock_not_available", Failure.LOCK_NOT_AVAILABLE, ambiguous_nowait=True),
    CodeRow("postgresql", "40P01", "deadlock_detected", Failure.DEADLOCK_DETECTED),
    CodeRow("postgresql", "40001", "serialization_failure", Failure.SERIALIZATION_FAILURE),
    # 57014 is both an expired statement_timeout and a pg_cancel_backend: the server's message tells (untranslated),
    # else whether lockkit set a statement timeout.
    CodeRow("postgresql", "57014", "query_canceled", Failure.QUERY_CANCELED, ambiguous_timeout=True),
    CodeRow("postgresql", "25006", "read_only_sql_transaction", Failure.READ_ONLY),
    # The server ended the session: a stop or restart, pg_terminate_backend, recovery, an idle timeout.
    CodeRow("postgresql", "57P01", "admin_shutdown", Failure.CONNECTION_LOST),
    CodeRow("postgresql", "57P02", "crash_shutdown", Failure.CONNECTION_LOST),
    CodeRow("postgresql", "57P03", "cannot_connect_now", Failure.CONNECTION_LOST),
    CodeRow("postgresql", "57P05", "idle_session_timeout", Failure.CONNECTION_LOST),
    CodeRow(
        "postgresql",
        "25P03",
        "idle_in_transaction_session_timeout",
        Failure.IDLE_IN_TRANSACTION_TIMEOUT,
        hint="the transaction sat idle between statements longer than idle_in_transaction_session_timeout, so the "
        "server rolled it back and closed the session: nothing committed. Retrying repeats the slow body; move "
        "slow work (external calls) out of the transaction or raise the timeout",
    ),
    # Class 08, connection exception (08000, 08003, 08006, 08001, 08004, 08007, 08P01...): a code of the class
    # that has no row of its own falls back to this one, as psycopg's error registry does.
    CodeRow("postgresql", "08", "connection_exception", Failure.CONNECTION_LOST),
    # The server answered a connection and refused it for a reason of the settings: never mended by a retry.
    # psycopg reports these without their code: recognised by their message (``refused_settings_code``).
    CodeRow(
        "postgresql", "3D000", "invalid_catalog_name", Failure.DATABASE_MISCONFIGURED, hint=_SETTINGS_HINT
    ),
    CodeRow(
        "postgresql",
        "28000",
        "invalid_authorization_specification",
        Failure.DATABASE_MISCONFIGURED,
        hint=_SETTINGS_HINT,
    ),
    CodeRow("postgresql", "28P01", "invalid_password", Failure.DATABASE_MISCONFIGURED, hint=_SETTINGS_HINT),
    # MySQL / MariaDB (mysqlclient puts the number in args[0]). MariaDB 10.11 reports a NOWAIT failure as 1205,
    # like an expired innodb_lock_wait_timeout (pinned in test_backend_mariadb.py); MySQL 8 reports it as 3572.
    CodeRow("mysql", "1205", "ER_LOCK_WAIT_TIMEOUT", Failure.LOCK_TIMEOUT, ambiguous_nowait=True),
    CodeRow("mysql", "1213", "ER_LOCK_DEADLOCK", Failure.DEADLOCK_DETECTED),
    # MariaDB with innodb_snapshot_isolation=ON (the default from 11.6.2): under REPEATABLE READ, a locking read
    # of a row changed since the transaction's snapshot; the whole transaction is rolled back, as on a deadlock.
    # https://mariadb.com/kb/en/innodb-system-variables/#innodb_snapshot_isolation
    CodeRow("mysql", "1020", "ER_CHECKREAD", Failure.SERIALIZATION_FAILURE),
    CodeRow("mysql", "3572", "ER_LOCK_NOWAIT", Failure.LOCK_NOT_AVAILABLE),
    CodeRow("mysql", "1969", "ER_STATEMENT_TIMEOUT", Failure.STATEMENT_TIMEOUT),
    CodeRow("mysql", "3024", "ER_QUERY_TIMEOUT", Failure.STATEMENT_TIMEOUT),
    CodeRow("mysql", "1290", "ER_OPTION_PREVENTS_STATEMENT", Failure.READ_ONLY),
    CodeRow("mysql", "1792", "ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION", Failure.READ_ONLY),
    CodeRow("mysql", "1836", "ER_READ_ONLY_MODE", Failure.READ_ONLY),
    CodeRow("mysql", "1317", "ER_QUERY_INTERRUPTED", Failure.QUERY_CANCELED),  # KILL QUERY
    # Client-side codes (CR_*) mysqlclient raises when the connection is gone, and the server's "killed" codes.
    CodeRow("mysql", "2006", "CR_SERVER_GONE_ERROR", Failure.CONNECTION_LOST),
    CodeRow("mysql", "2013", "CR_SERVER_LOST", Failure.CONNECTION_LOST),
    CodeRow("mysql", "2055", "CR_SERVER_LOST_EXTENDED", Failure.CONNECTION_LOST),
    CodeRow("mysql", "4031", "ER_CLIENT_INTERACTION_TIMEOUT", Failure.CONNECTION_LOST),
    CodeRow("mysql", "1927", "ER_CONNECTION_KILLED", Failure.CONNECTION_LOST),
    # No connection made: the server refuses (down, restarting, failing over) or is shutting down. Nothing was
    # sent, so a call retries it for its reconnect_within, as PostgreSQL's class 08 at connect.
    CodeRow("mysql", "2002", "CR_CONNECTION_ERROR", Failure.CONNECTION_LOST),
    CodeRow("mysql", "2003", "CR_CONN_HOST_ERROR", Failure.CONNECTION_LOST),
    CodeRow("mysql", "1053", "ER_SERVER_SHUTDOWN", Failure.CONNECTION_LOST),
    # The server answered and refused the connection's settings: an unknown database, user or a wrong password.
    CodeRow("mysql", "1049", "ER_BAD_DB_ERROR", Failure.DATABASE_MISCONFIGURED, hint=_SETTINGS_HINT),
    CodeRow("mysql", "1045", "ER_ACCESS_DENIED_ERROR", Failure.DATABASE_MISCONFIGURED, hint=_SETTINGS_HINT),
    CodeRow("mysql", "1044", "ER_DBACCESS_DENIED_ERROR", Failure.DATABASE_MISCONFIGURED, hint=_SETTINGS_HINT),
    CodeRow(
        "mysql",
        "1698",
        "ER_ACCESS_DENIED_NO_PASSWORD_ERROR",
        Failure.DATABASE_MISCONFIGURED,
        hint=_SETTINGS_HINT,
    ),
    # SQLite extended result codes (sqlite3 exceptions carry sqlite_errorcode on Python 3.11+).
    # "database is locked" is SQLITE_BUSY: the busy timeout (lockkit's lock_timeout at BEGIN IMMEDIATE) expired.
    # https://www.sqlite.org/rescode.html
    CodeRow("sqlite", "5", "SQLITE_BUSY", Failure.LOCK_TIMEOUT),
    CodeRow("sqlite", "261", "SQLITE_BUSY_RECOVERY", Failure.LOCK_TIMEOUT),
    CodeRow("sqlite", "517", "SQLITE_BUSY_SNAPSHOT", Failure.SERIALIZATION_FAILURE),
    CodeRow("sqlite", "773", "SQLITE_BUSY_TIMEOUT", Failure.LOCK_TIMEOUT),
    CodeRow("sqlite", "6", "SQLITE_LOCKED", Failure.LOCK_NOT_AVAILABLE, hint=_SHARED_CACHE_HINT),
    CodeRow(
        "sqlite", "262", "SQLITE_LOCKED_SHAREDCACHE", Failure.LOCK_NOT_AVAILABLE, hint=_SHARED_CACHE_HINT
    ),
    CodeRow("sqlite", "8", "SQLITE_READONLY", Failure.READ_ONLY),
    # Oracle (oracledb: args[0].code). https://docs.oracle.com/en/error-help/db/
    # ORA-00054 is "resource busy and acquire with NOWAIT specified or timeout expired" (a DDL lock timeout too).
    CodeRow("oracle", "54", "ORA-00054", Failure.LOCK_NOT_AVAILABLE, ambiguous_nowait=True),
    CodeRow("oracle", "30006", "ORA-30006", Failure.LOCK_TIMEOUT),
    CodeRow("oracle", "60", "ORA-00060", Failure.DEADLOCK_DETECTED),
    CodeRow("oracle", "8177", "ORA-08177", Failure.SERIALIZATION_FAILURE),
    CodeRow("oracle", "16000", "ORA-16000", Failure.READ_ONLY),
    CodeRow("oracle", "1013", "ORA-01013", Failure.QUERY_CANCELED),
    CodeRow("oracle", "3113", "ORA-03113", Failure.CONNECTION_LOST),
    CodeRow("oracle", "3114", "ORA-03114", Failure.CONNECTION_LOST),
    CodeRow("oracle", "3135", "ORA-03135", Failure.CONNECTION_LOST),
)

_INDEX: dict[tuple[str, str], CodeRow] = {(row.vendor, row.code): row for row in CODES}


def chain(exc: BaseException) -> list[BaseException]:
    """Return ``exc`` and the exceptions on its ``__cause__``/``__context__`` chain, nearest first, bounded.

    The chain is followed the way Python's traceback shows it: ``__cause__`` when set, else ``__context__`` unless
    suppressed with ``raise ... from None``.
    """
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < _MAX_CHAIN and all(current is not s for s in seen):
        seen.append(current)
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__suppress_context__:
            current = None
        else:
            current = current.__context__
    return seen


def vendor_code(exc: BaseException) -> tuple[str, str] | None:
    """Read ``(vendor, code)`` off one driver exception, or ``None`` when it carries no code lockkit reads."""
    module = type(exc).__module__
    if module.startswith("psycopg"):
        # psycopg 3 names it sqlstate, psycopg2 pgcode; client-side errors have neither.
        code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        return ("postgresql", str(code)) if code else None
    if module.startswith(("MySQLdb", "pymysql")):
        number = exc.args[0] if exc.args else None
        return ("mysql", str(number)) if isinstance(number, int) else None
    if module == "sqlite3":
        number = getattr(exc, "sqlite_errorcode", None)
        return ("sqlite", str(number)) if isinstance(number, int) else None
    if module.startswith(("oracledb", "cx_Oracle")):
        error = exc.args[0] if exc.args else None
        number = getattr(error, "code", None)
        if not number:
            # An error built from its message only has code 0 but full_code "ORA-00054".
            full_code = str(getattr(error, "full_code", "") or "")
            number = int(full_code[4:]) if full_code.startswith("ORA-") and full_code[4:].isdigit() else None
        return ("oracle", str(number)) if isinstance(number, int) and number else None
    return None


# Driver errors that carry no code but mean the connection is gone: psycopg2 reports a session the server ended
# as "InterfaceError: connection already closed"; mysqlclient raises InterfaceError(0, "") on a closed connection.
_CONNECTION_GONE_TYPES = frozenset({("psycopg2", "InterfaceError"), ("MySQLdb", "InterfaceError")})
_CONNECTION_LOST_ROW = CodeRow("driver", "", "connection closed", Failure.CONNECTION_LOST)


def _row_for(key: tuple[str, str]) -> CodeRow | None:
    row = _INDEX.get(key)
    if row is None and key[0] == "postgresql":
        row = _INDEX.get(("postgresql", key[1][:2]))  # the SQLSTATE class, when the table has it
    return row


def lookup(exc: BaseException) -> CodeRow | None:
    """Find the table row for the nearest exception on ``exc``'s chain that carries a known code.

    A driver error that carries no code but means the connection is gone (psycopg2's and mysqlclient's
    ``InterfaceError``) finds a ``Failure.CONNECTION_LOST`` row.
    """
    for link in chain(exc):
        key = vendor_code(link)
        if key is not None:
            row = _row_for(key)
            if row is not None:
                return row
        elif (type(link).__module__.split(".", 1)[0], type(link).__name__) in _CONNECTION_GONE_TYPES:
            return _CONNECTION_LOST_ROW
        elif (code := refused_settings_code(link)) is not None:
            return _INDEX[("postgresql", code)]
    return None


# PostgreSQL's messages refusing a connection's settings, untranslated, with the SQLSTATE each is raised with
# (src/backend/utils/init/postinit.c, miscinit.c, libpq/auth.c), and libpq's own when the server asked for a
# password and none was given. psycopg (3 and 2) reports a failed connection without the server's SQLSTATE.
_REFUSED_SETTINGS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r'database ".+" does not exist'), "3D000"),
    (re.compile(r'role ".+" does not exist'), "28000"),
    (re.compile(r'role ".+" is not permitted to log in'), "28000"),
    (re.compile(r"no pg_hba\.conf entry for host "), "28000"),
    (re.compile(r"pg_hba\.conf rejects connection for host "), "28000"),
    (re.compile(r'password authentication failed for user "'), "28P01"),
    # Only the methods the server decides alone (peer credentials, a client certificate): LDAP, RADIUS, PAM,
    # Ident and GSSAPI/SSPI ask a service that may be down, and say the same words for a wrong password as for
    # an unreachable service: a retry may succeed, so they stay lost connections.
    (re.compile(r'(?:Peer|certificate) authentication failed for user "'), "28000"),
    (re.compile(r"fe_sendauth: no password supplied"), "28P01"),
)


def refused_settings_code(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg connection failure without one, when the server refused the connection's settings.

    psycopg raises a failed connection as a code-less ``OperationalError`` whose text is libpq's message, the
    server's own included ("FATAL:  database "x" does not exist"): the untranslated text is then the only sign
    (a server whose ``lc_messages`` translates it gives none, and the failure stays a lost connection). Only this
    exception is read, not its chain; an error that carries a code is never read by its text.

    Returns:
        ``"3D000"`` (no such database), ``"28000"`` (no such role, not allowed to log in, refused by
        ``pg_hba.conf``, a failed peer or certificate authentication) or ``"28P01"`` (a wrong or missing
        password), or ``None``: an authentication service the server asks (LDAP, RADIUS, PAM, Ident, GSSAPI)
        reports its outage in the words of a refusal, and a retry may succeed.
    """
    if not type(exc).__module__.startswith("psycopg") or vendor_code(exc) is not None:
        return None
    text = str(exc)
    return next((code for pattern, code in _REFUSED_SETTINGS if pattern.search(text)), None)


def code_of(exc: BaseException) -> str | None:
    """Return the first SQLSTATE or vendor code found on ``exc``'s chain, known to the table or not."""
    for link in chain(exc):
        key = vendor_code(link)
        if key is not None:
            return key[1]
    return None


def classify(exc: BaseException, *, nowait: bool | None = None, timed: bool | None = None) -> Failure | None:
    """Say which locking failure an exception reports, from the SQLSTATE or vendor code on its chain.

    The code is read from the exception and its ``__cause__``/``__context__`` chain, so Django-wrapped and bare
    driver errors (psycopg 3, psycopg2, mysqlclient, sqlite3, oracledb) classify alike. A lockkit error reports
    its own kind. PostgreSQL reports both a ``NOWAIT`` failure and an expired ``lock_timeout`` as SQLSTATE 55P03;
    an error raised by the server's lock timer is always ``Failure.LOCK_TIMEOUT`` (``timer_fired``: NOWAIT
    covers row locks only, so a NOWAIT statement can still wait for a table lock); otherwise ``nowait`` decides, and when it is ``None`` the code's own meaning is reported (``Failure.LOCK_NOT_AVAILABLE`` for 55P03 and
    ORA-00054, ``Failure.LOCK_TIMEOUT`` for MariaDB's 1205).
    Likewise SQLSTATE 57014 is an expired statement timeout (from any source: lockkit, a role setting, the
    connection's options, ``SET LOCAL``) or a cancel, both raised by the same server function: the server's primary
    message tells them apart (``statement_timer_fired``); a translated message (``lc_messages``) cannot, and then
    ``timed`` does, and without it the code's own name, ``Failure.QUERY_CANCELED``, is reported. A lost connection is recognised by its code (class 08, 57P01...) or by the driver's code-less
    ``InterfaceError``; ``lockkit.errorcodes.translate`` also reads the driver's connection state, which this function
    cannot see.
    See https://www.postgresql.org/docs/current/errcodes-appendix.html.

    Args:
        exc: Any exception.
        nowait: Whether the failing statement used ``NOWAIT``; ``None`` for the code's own meaning.
        timed: Whether a statement timeout was set for the failing statement; ``None`` for the code's own
            meaning.

    Returns:
        The ``Failure`` kind, or ``None`` when the exception is not a locking failure lockkit knows.

    Raises:
        TypeError: ``exc`` is not an exception, or ``nowait`` is not a ``bool`` or ``None``.
    """
    if not isinstance(exc, BaseException):
        raise TypeError(f"exc must be an exception, not {type(exc).__name__}")
    if nowait is not None and not isinstance(nowait, bool):
        raise TypeError(f"nowait must be a bool or None, not {type(nowait).__name__}")
    if isinstance(exc, LockError):
        return exc.failure
    row = lookup(exc)
    if row is None:
        # psycopg before 3.2 reports the server's FATAL for it without its code: its (untranslated) text tells.
        return Failure.IDLE_IN_TRANSACTION_TIMEOUT if idle_in_transaction_ended(exc) else None
    if row.ambiguous_timeout:
        fired = statement_timer_fired(exc)
        if fired is None:
            fired = bool(timed)
        return Failure.STATEMENT_TIMEOUT if fired else Failure.QUERY_CANCELED
    if not row.ambiguous_nowait:
        return row.failure
    if row.vendor == "postgresql" and timer_fired(exc):
        # The statement waited until lock_timeout expired: even in a NOWAIT scope (NOWAIT covers row locks only,
        # a table lock is waited for), this is a lock timeout, not "the lock was not available at once".
        return Failure.LOCK_TIMEOUT
    if nowait is None:
        return row.failure
    return Failure.LOCK_NOT_AVAILABLE if nowait else Failure.LOCK_TIMEOUT


# PostgreSQL's FATAL when idle_in_transaction_session_timeout ends a session (src/backend/tcop/postgres.c).
_IDLE_IN_TRANSACTION_TEXT = "terminating connection due to idle-in-transaction timeout"


def idle_in_transaction_ended(exc: BaseException) -> bool:
    """Whether a code-less error carries PostgreSQL's message for an idle-in-transaction termination (25P03).

    psycopg before 3.2 raises the server's FATAL as a code-less ``OperationalError`` ("consuming input failed:
    terminating connection due to idle-in-transaction timeout"); the untranslated text is then the only sign.
    """
    return any(_IDLE_IN_TRANSACTION_TEXT in str(link) for link in chain(exc))


def row_for(vendor: str, code: str) -> CodeRow | None:
    """The table's row for ``code`` of ``vendor``, or ``None``."""
    return next((row for row in CODES if row.vendor == vendor and row.code == code), None)


# The primary messages PostgreSQL's ProcessInterrupts gives a 57014, untranslated (src/backend/tcop/postgres.c).
_STATEMENT_TIMEOUT_MESSAGE = "canceling statement due to statement timeout"
_CANCEL_MESSAGES = frozenset({"canceling statement due to user request", "canceling autovacuum task"})


def statement_timer_fired(exc: BaseException) -> bool | None:
    """Whether a PostgreSQL 57014 came from an expired ``statement_timeout`` rather than from a cancel request.

    Both carry SQLSTATE 57014 and the same source function; the server's primary message (psycopg's
    ``diag.message_primary``) is the only difference the error carries. It is compared whole with the server's
    untranslated texts, so a server whose ``lc_messages`` translates them gives ``None``.
    See https://www.postgresql.org/docs/current/errcodes-appendix.html.

    Returns:
        ``True`` for "canceling statement due to statement timeout", ``False`` for a cancel ("... due to user
        request", "canceling autovacuum task"), ``None`` when the error carries neither (translated, or no
        PostgreSQL diagnostics).
    """
    for link in chain(exc):
        diag = getattr(link, "diag", None)
        message = getattr(diag, "message_primary", None)
        if type(link).__module__.startswith("psycopg") and isinstance(message, str):
            if message == _STATEMENT_TIMEOUT_MESSAGE:
                return True
            if message in _CANCEL_MESSAGES:
                return False
            return None
    return None


# The server function that raises the errors of PostgreSQL's timers (lock_timeout, statement_timeout): every
# lock_timeout expiry is reported from there, and no NOWAIT failure is. Where NOWAIT itself fails without
# waiting, it names the lock code (heap_lock_tuple for a row, RangeVarGetRelidExtended for LOCK TABLE NOWAIT).
_TIMER_FUNCTION = "ProcessInterrupts"


def timer_fired(exc: BaseException) -> bool | None:
    """Whether a PostgreSQL 55P03 came from the lock timer (the statement waited) rather than from ``NOWAIT``.

    NOWAIT covers row locks only: a ``SELECT ... FOR UPDATE NOWAIT`` on a table another session holds in
    ``ACCESS EXCLUSIVE`` mode (a migration) waits for the table lock until ``lock_timeout`` expires, and both
    outcomes carry SQLSTATE 55P03. The error's source-function field (``PG_DIAG_SOURCE_FUNCTION``, which the
    server sends with every error, read through psycopg's ``diag``; structured data, not the message text) tells
    them apart. See https://www.postgresql.org/docs/current/protocol-error-fields.html.

    Returns:
        ``True`` when the timer fired (the statement waited), ``False`` when another server function raised it
        (NOWAIT, a PL/pgSQL ``RAISE``), ``None`` when the error carries no PostgreSQL source function (a
        client-built error, CockroachDB).
    """
    for link in chain(exc):
        if type(link).__module__.startswith("psycopg"):
            diag = getattr(link, "diag", None)
            function = getattr(diag, "source_function", None)
            source_file = getattr(diag, "source_file", None)
            # Only PostgreSQL's own C sources count: CockroachDB fills these fields with Go names.
            if (
                not isinstance(function, str)
                or not isinstance(source_file, str)
                or not source_file.endswith(".c")
            ):
                return None
            return function == _TIMER_FUNCTION
    return None
