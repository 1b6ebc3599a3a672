"""The code table, pinned once, without a server: real driver exception objects (psycopg, mysqlclient, sqlite3,
oracledb; psycopg as CockroachDB reports them), wrapped the way Django wraps them, classified by lockkit."""

from __future__ import annotations

import sqlite3
from types import ModuleType
from typing import Any

import oracledb
import psycopg
import pytest
from django.db.utils import DatabaseError as DjangoDatabaseError
from django.db.utils import DatabaseErrorWrapper
from oracledb import errors as oracle_errors

from lockkit import Failure, classify
from lockkit.errorcodes.table import CODES, code_of, lookup, row_for

F = Failure


class _Wrapper:
    """Just enough of a Django DatabaseWrapper for ``DatabaseErrorWrapper``: the driver module and a flag."""

    def __init__(self, driver: ModuleType) -> None:
        self.Database = driver
        self.errors_occurred = False


def django_wrapped(driver: ModuleType, exc: BaseException) -> BaseException:
    """Raise ``exc`` through Django's own error wrapper and return what user code would catch."""
    with pytest.raises(DjangoDatabaseError) as caught, DatabaseErrorWrapper(_Wrapper(driver)):
        raise exc
    assert caught.value.__cause__ is exc
    return caught.value


def oracle_error(code: int, message: str) -> BaseException:
    """The exception the oracledb driver raises for a server error: ``_Error`` picks the exception class."""
    error = oracle_errors._Error(f"ORA-{code:05}: {message}", code=code)
    return error.exc_type(error)


def driver_error(vendor: str, code: str, message: str) -> BaseException:
    """A real driver exception for ``code``, raised through Django's error wrapper as user code sees it."""
    if vendor == "postgresql":
        return django_wrapped(psycopg, psycopg.errors.lookup(code)(message))
    if vendor == "oracle":
        return django_wrapped(oracledb, oracle_error(int(code), message))
    if vendor == "mysql":  # mysqlclient compiles against the MariaDB client library: the `mysql` extra
        mysqldb: Any = pytest.importorskip(
            "MySQLdb", reason="mysqlclient is not installed (pip install '.[mysql]')"
        )
        return django_wrapped(mysqldb, mysqldb.OperationalError(int(code), message))
    error = sqlite3.OperationalError(message)
    error.sqlite_errorcode = int(code)  # set by the sqlite3 module on errors from the library
    return django_wrapped(sqlite3, error)


# The code table, pinned once: a change to a row must change this table too. Each row also goes through its real
# driver's exception class, wrapped by Django, and back through classify() and code_of().
# (vendor, code, failure, ambiguous under NOWAIT, the driver's message)
TABLE = [
    ("postgresql", "55P03", F.LOCK_NOT_AVAILABLE, True, "could not obtain lock on row in relation"),
    ("postgresql", "40P01", F.DEADLOCK_DETECTED, False, "deadlock detected"),
    ("postgresql", "40001", F.SERIALIZATION_FAILURE, False, "could not serialize access"),
    # 57014 by its own name; a statement timeout only when one was set (test_57014_...).
    ("postgresql", "57014", F.QUERY_CANCELED, False, "canceling statement due to user request"),
    ("postgresql", "25006", F.READ_ONLY, False, "cannot execute UPDATE in a read-only transaction"),
    ("postgresql", "57P01", F.CONNECTION_LOST, False, "terminating connection due to administrator command"),
    ("postgresql", "57P02", F.CONNECTION_LOST, False, "terminating connection because of crash of another"),
    ("postgresql", "57P03", F.CONNECTION_LOST, False, "the database system is shutting down"),
    ("postgresql", "57P05", F.CONNECTION_LOST, False, "terminating connection due to idle-session timeout"),
    (
        "postgresql",
        "25P03",
        F.IDLE_IN_TRANSACTION_TIMEOUT,
        False,
        "terminating connection due to idle-in-transaction",
    ),
    # The server refused the connection's settings (psycopg reports them without a code: test_refused_settings_...).
    ("postgresql", "3D000", F.DATABASE_MISCONFIGURED, False, 'database "ha_x" does not exist'),
    ("postgresql", "28000", F.DATABASE_MISCONFIGURED, False, 'role "ha_x" does not exist'),
    ("postgresql", "28P01", F.DATABASE_MISCONFIGURED, False, 'password authentication failed for user "x"'),
    # MariaDB's NOWAIT failure is 1205 too (pinned on the real server in test_backend_mariadb.py).
    ("mysql", "1205", F.LOCK_TIMEOUT, True, "Lock wait timeout exceeded; try restarting transaction"),
    ("mysql", "1213", F.DEADLOCK_DETECTED, False, "Deadlock found when trying to get lock"),
    # MariaDB 11.6+ snapshot isolation (pinned on the real server in test_mariadb.py).
    ("mysql", "1020", F.SERIALIZATION_FAILURE, False, "Record has changed since last read in table 't'"),
    (
        "mysql",
        "3572",
        F.LOCK_NOT_AVAILABLE,
        False,
        "lock(s) could not be acquired immediately and NOWAIT is set",
    ),
    (
        "mysql",
        "1969",
        F.STATEMENT_TIMEOUT,
        False,
        "Query execution was interrupted (max_statement_time exceeded)",
    ),
    ("mysql", "3024", F.STATEMENT_TIMEOUT, False, "maximum statement execution time exceeded"),
    ("mysql", "1290", F.READ_ONLY, False, "The MariaDB server is running with the --read-only option"),
    ("mysql", "1792", F.READ_ONLY, False, "Cannot execute statement in a READ ONLY transaction"),
    ("mysql", "1836", F.READ_ONLY, False, "Running in read-only mode"),
    ("mysql", "1317", F.QUERY_CANCELED, False, "Query execution was interrupted"),
    ("mysql", "2006", F.CONNECTION_LOST, False, "Server has gone away"),
    ("mysql", "2013", F.CONNECTION_LOST, False, "Lost connection to server during query"),
    ("mysql", "2055", F.CONNECTION_LOST, False, "Lost connection to server at 'reading initial packet'"),
    ("mysql", "4031", F.CONNECTION_LOST, False, "disconnected by the server because of inactivity"),
    ("mysql", "1927", F.CONNECTION_LOST, False, "Connection was killed"),
    ("mysql", "2002", F.CONNECTION_LOST, False, "Can't connect to server on '127.0.0.1' (115)"),
    ("mysql", "2003", F.CONNECTION_LOST, False, "Can't connect to MySQL server on '10.0.0.1' (110)"),
    ("mysql", "1053", F.CONNECTION_LOST, False, "Server shutdown in progress"),
    ("mysql", "1049", F.DATABASE_MISCONFIGURED, False, "Unknown database 'ha_x'"),
    (
        "mysql",
        "1045",
        F.DATABASE_MISCONFIGURED,
        False,
        "Access denied for user 'x'@'h' (using password: YES)",
    ),
    ("mysql", "1044", F.DATABASE_MISCONFIGURED, False, "Access denied for user 'x'@'h' to database 'ha_x'"),
    ("mysql", "1698", F.DATABASE_MISCONFIGURED, False, "Access denied for user 'x'@'h'"),
    ("sqlite", "5", F.LOCK_TIMEOUT, False, "database is locked"),
    ("sqlite", "261", F.LOCK_TIMEOUT, False, "database is locked"),
    ("sqlite", "517", F.SERIALIZATION_FAILURE, False, "database is locked"),
    ("sqlite", "773", F.LOCK_TIMEOUT, False, "database is locked"),
    # Shared-cache table locks ("database table is locked"): never waited for, so not a timeout.
    ("sqlite", "6", F.LOCK_NOT_AVAILABLE, False, "database table is locked"),
    ("sqlite", "262", F.LOCK_NOT_AVAILABLE, False, "database table is locked"),
    ("sqlite", "8", F.READ_ONLY, False, "attempt to write a readonly database"),
    ("oracle", "54", F.LOCK_NOT_AVAILABLE, True, "resource busy and acquire with NOWAIT specified"),
    ("oracle", "30006", F.LOCK_TIMEOUT, False, "resource busy; acquire with WAIT timeout expired"),
    ("oracle", "60", F.DEADLOCK_DETECTED, False, "deadlock detected while waiting for resource"),
    ("oracle", "8177", F.SERIALIZATION_FAILURE, False, "can't serialize access for this transaction"),
    ("oracle", "16000", F.READ_ONLY, False, "database open for read-only access"),
    ("oracle", "1013", F.QUERY_CANCELED, False, "user requested cancel of current operation"),
    ("oracle", "3113", F.CONNECTION_LOST, False, "end-of-file on communication channel"),
    ("oracle", "3114", F.CONNECTION_LOST, False, "not connected to ORACLE"),
    ("oracle", "3135", F.CONNECTION_LOST, False, "connection lost contact"),
]
# Rows for a whole SQLSTATE class: a code of the class without a row of its own falls back to them.
CLASS_ROWS = [("postgresql", "08", F.CONNECTION_LOST, False)]


def test_the_code_table_is_pinned() -> None:
    actual = {(row.vendor, row.code): (row.failure, row.ambiguous_nowait) for row in CODES}
    expected = {(vendor, code): (failure, ambiguous) for vendor, code, failure, ambiguous, _ in TABLE}
    expected.update({(vendor, code): (failure, ambiguous) for vendor, code, failure, ambiguous in CLASS_ROWS})
    assert actual == expected
    assert len(CODES) == len(expected)  # no duplicate (vendor, code)
    assert {(row.vendor, row.code) for row in CODES if row.ambiguous_timeout} == {("postgresql", "57014")}


@pytest.mark.parametrize("code", ["08000", "08003", "08006", "08001", "08004", "08007", "08P01"])
def test_every_connection_exception_code_is_connection_lost(code: str) -> None:
    exc = driver_error("postgresql", code, "connection failure")
    assert code_of(exc) == code
    assert classify(exc) is F.CONNECTION_LOST


def test_57014_is_a_statement_timeout_only_when_one_was_set() -> None:
    exc = driver_error("postgresql", "57014", "canceling statement due to statement timeout")
    assert classify(exc, timed=True) is F.STATEMENT_TIMEOUT
    assert classify(exc, timed=False) is F.QUERY_CANCELED


def test_code_less_driver_errors_of_a_closed_connection_are_connection_lost() -> None:
    import psycopg2
    from django.db.utils import InterfaceError

    with pytest.raises(InterfaceError) as caught, DatabaseErrorWrapper(_Wrapper(psycopg2)):
        raise psycopg2.InterfaceError("connection already closed")  # psycopg2's word for a terminated session
    closed = caught.value
    assert classify(closed) is F.CONNECTION_LOST
    assert code_of(closed) is None
    client_side = django_wrapped(psycopg, psycopg.OperationalError("consuming input failed"))
    assert (
        classify(client_side) is None
    )  # no code: only the connection's state tells (lockkit.errorcodes.translate)


@pytest.mark.parametrize(
    ("vendor", "code", "failure", "ambiguous", "message"), TABLE, ids=[f"{v}-{c}" for v, c, *_ in TABLE]
)
def test_each_row_classifies_its_drivers_error(
    vendor: str, code: str, failure: Failure, ambiguous: bool, message: str
) -> None:
    exc = driver_error(vendor, code, message)
    assert code_of(exc) == code
    assert classify(exc) is failure  # outside a scope: the row's own failure
    if ambiguous:  # told apart by the scope's nowait option
        assert classify(exc, nowait=True) is F.LOCK_NOT_AVAILABLE
        assert classify(exc, nowait=False) is F.LOCK_TIMEOUT


def test_oracle_error_built_from_its_message_only_is_read_from_full_code() -> None:
    error = oracle_errors._Error("ORA-00060: deadlock detected while waiting for resource")
    assert error.code == 0
    assert classify(oracledb.DatabaseError(error)) is F.DEADLOCK_DETECTED


def test_oracle_unrelated_error_is_not_classified() -> None:
    assert classify(django_wrapped(oracledb, oracle_error(942, "table or view does not exist"))) is None


def test_cockroachdb_lock_timeout_and_nowait_share_55p03() -> None:
    exc = django_wrapped(psycopg, psycopg.errors.LockNotAvailable("could not obtain lock on row in t@t_pkey"))
    assert classify(exc, nowait=True) is F.LOCK_NOT_AVAILABLE
    assert classify(exc, nowait=False) is F.LOCK_TIMEOUT


# CockroachDB speaks the PostgreSQL protocol: psycopg raises its SQLSTATE classes with CockroachDB's messages.
COCKROACH = [
    (
        "40001",
        "restart transaction: TransactionRetryWithProtoRefreshError: WriteTooOldError",
        F.SERIALIZATION_FAILURE,
    ),
    (
        "40001",
        "restart transaction: TransactionRetryWithProtoRefreshError: ReadWithinUncertaintyIntervalError",
        F.SERIALIZATION_FAILURE,
    ),
    (
        "40001",
        "restart transaction: TransactionRetryWithProtoRefreshError: TransactionAbortedError("
        "ABORT_REASON_CLIENT_REJECT)",
        F.SERIALIZATION_FAILURE,
    ),
    (
        "40001",
        "restart transaction: TransactionRetryWithProtoRefreshError: TransactionRetryError: "
        "retry txn (RETRY_SERIALIZABLE)",
        F.SERIALIZATION_FAILURE,
    ),
    ("55P03", "canceling statement due to lock timeout on row (k)=(1) in t@t_pkey", F.LOCK_NOT_AVAILABLE),
    ("57014", "query execution canceled due to statement timeout", F.QUERY_CANCELED),  # outside a timed scope
    ("25006", "cannot execute FOR UPDATE in a read-only transaction", F.READ_ONLY),
]


@pytest.mark.parametrize(("sqlstate", "message", "failure"), COCKROACH)
def test_cockroachdb_codes(sqlstate: str, message: str, failure: Failure) -> None:
    driver_error: Any = psycopg.errors.lookup(sqlstate)(message)
    assert driver_error.sqlstate == sqlstate
    exc = django_wrapped(psycopg, driver_error)
    assert classify(exc) is failure
    assert code_of(exc) == sqlstate


def test_cockroachdb_ambiguous_commit_is_not_classified() -> None:
    """40003: the commit may or may not have happened, so it must never be retried blindly."""
    exc = django_wrapped(psycopg, psycopg.errors.lookup("40003")("result is ambiguous"))
    assert classify(exc) is None
    assert code_of(exc) == "40003"


# libpq's text of a failed connection, as psycopg raises it without a code, with the SQLSTATE the server sent.
REFUSED_SETTINGS = [
    ('database "ha_x" does not exist', "3D000"),
    ('role "ha_x" does not exist', "28000"),
    ('role "ha_x" is not permitted to log in', "28000"),
    ('no pg_hba.conf entry for host "10.0.0.1", user "u", database "d", no encryption', "28000"),
    ('pg_hba.conf rejects connection for host "10.0.0.1", user "u", database "d", no encryption', "28000"),
    ('password authentication failed for user "u"', "28P01"),
    ('Peer authentication failed for user "u"', "28000"),
    ('certificate authentication failed for user "u"', "28000"),
]


@pytest.mark.parametrize(("server", "code"), REFUSED_SETTINGS)
def test_refused_settings_are_recognised_in_psycopgs_code_less_connection_failure(
    server: str, code: str
) -> None:
    message = f'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  {server}'
    error = django_wrapped(psycopg, psycopg.OperationalError(message))
    assert code_of(error) is None  # psycopg gives no code for it
    assert classify(error) is F.DATABASE_MISCONFIGURED
    assert lookup(error) is row_for("postgresql", code)


@pytest.mark.parametrize(
    "message",
    [
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: Connection refused\n\tIs the '
        "server running on that host and accepting TCP/IP connections?",
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  the database system '
        "is starting up",
        "consuming input failed: server closed the connection unexpectedly",
        # An authentication service the server asks may be down: the same words as a wrong password there.
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  LDAP authentication '
        'failed for user "u"',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  RADIUS authentication '
        'failed for user "u"',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  PAM authentication '
        'failed for user "u"',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  Ident authentication '
        'failed for user "u"',
    ],
)
def test_a_server_down_or_starting_is_not_a_refusal_of_the_settings(message: str) -> None:
    assert classify(django_wrapped(psycopg, psycopg.OperationalError(message))) is None  # lost, by its state


def test_a_message_is_never_read_when_the_error_carries_a_code() -> None:
    error = django_wrapped(psycopg, psycopg.errors.lookup("42P01")('relation "database "x" does not exist"'))
    assert classify(error) is None
