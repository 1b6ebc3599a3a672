"""Vendor error codes without a server: real driver exception objects (oracledb, psycopg as CockroachDB
reports them, mysqlclient), wrapped the way Django wraps them, classified by lockkit. Pins every vendor
row."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import oracledb
import psycopg
import pytest
from django.db.utils import DatabaseError as DjangoDatabaseError
from django.db.utils import DatabaseErrorWrapper
from oracledb import errors as oracle_errors

from lockkit import Failure, classify
from lockkit.codes import CODES, code_of

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


ORACLE = [
    (54, "resource busy and acquire with NOWAIT specified or timeout expired", F.LOCK_NOT_AVAILABLE),
    (30006, "resource busy; acquire with WAIT timeout expired", F.LOCK_TIMEOUT),
    (60, "deadlock detected while waiting for resource", F.DEADLOCK_DETECTED),
    (8177, "can't serialize access for this transaction", F.SERIALIZATION_FAILURE),
    (16000, "database or pluggable database open for read-only access", F.READ_ONLY),
]


@pytest.mark.parametrize(("code", "message", "failure"), ORACLE)
def test_oracle_codes(code: int, message: str, failure: Failure) -> None:
    exc = django_wrapped(oracledb, oracle_error(code, message))
    assert classify(exc) is failure
    assert code_of(exc) == str(code)


def test_oracle_resource_busy_is_told_apart_by_the_scope_option() -> None:
    exc = django_wrapped(oracledb, oracle_error(54, ORACLE[0][1]))
    assert classify(exc, nowait=True) is F.LOCK_NOT_AVAILABLE
    assert classify(exc, nowait=False) is F.LOCK_TIMEOUT


def test_oracle_error_built_from_its_message_only_is_read_from_full_code() -> None:
    error = oracle_errors._Error("ORA-00060: deadlock detected while waiting for resource")
    assert error.code == 0
    assert classify(oracledb.DatabaseError(error)) is F.DEADLOCK_DETECTED


def test_oracle_unrelated_error_is_not_classified() -> None:
    assert classify(django_wrapped(oracledb, oracle_error(942, "table or view does not exist"))) is None


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
    ("57014", "query execution canceled due to statement timeout", F.STATEMENT_TIMEOUT),
    ("25006", "cannot execute FOR UPDATE in a read-only transaction", F.READ_ONLY),
]


@pytest.mark.parametrize(("sqlstate", "message", "failure"), COCKROACH)
def test_cockroachdb_codes(sqlstate: str, message: str, failure: Failure) -> None:
    driver_error: Any = psycopg.errors.lookup(sqlstate)(message)
    assert driver_error.sqlstate == sqlstate
    exc = django_wrapped(psycopg, driver_error)
    assert classify(exc) is failure
    assert code_of(exc) == sqlstate


def test_cockroachdb_lock_timeout_and_nowait_share_55p03() -> None:
    exc = django_wrapped(psycopg, psycopg.errors.LockNotAvailable("could not obtain lock on row in t@t_pkey"))
    assert classify(exc, nowait=True) is F.LOCK_NOT_AVAILABLE
    assert classify(exc, nowait=False) is F.LOCK_TIMEOUT


def test_cockroachdb_ambiguous_commit_is_not_classified() -> None:
    """40003: the commit may or may not have happened, so it must never be retried blindly."""
    exc = django_wrapped(psycopg, psycopg.errors.lookup("40003")("result is ambiguous"))
    assert classify(exc) is None
    assert code_of(exc) == "40003"


MYSQL = [
    (1205, "Lock wait timeout exceeded; try restarting transaction", F.LOCK_TIMEOUT),
    (1213, "Deadlock found when trying to get lock; try restarting transaction", F.DEADLOCK_DETECTED),
    (
        3572,
        "Statement aborted because lock(s) could not be acquired immediately and NOWAIT is set.",
        F.LOCK_NOT_AVAILABLE,
    ),
    (1969, "Query execution was interrupted (max_statement_time exceeded)", F.STATEMENT_TIMEOUT),
    (3024, "Query execution was interrupted, maximum statement execution time exceeded", F.STATEMENT_TIMEOUT),
    (
        1290,
        "The MariaDB server is running with the --read-only option so it cannot execute this statement",
        F.READ_ONLY,
    ),
    (1792, "Cannot execute statement in a READ ONLY transaction", F.READ_ONLY),
    (1836, "Running in read-only mode", F.READ_ONLY),
]


@pytest.fixture
def mysqldb() -> Any:
    """mysqlclient's module; it compiles against the MariaDB/MySQL client library, so it is the `mysql` extra."""
    return pytest.importorskip("MySQLdb", reason="mysqlclient is not installed (pip install -e '.[mysql]')")


@pytest.mark.parametrize(("number", "message", "failure"), MYSQL)
def test_mysql_codes_outside_a_scope(mysqldb: Any, number: int, message: str, failure: Failure) -> None:
    exc = django_wrapped(mysqldb, mysqldb.OperationalError(number, message))
    assert classify(exc) is failure
    assert code_of(exc) == str(number)


def test_mysql_1205_is_lock_not_available_in_a_nowait_scope(mysqldb: Any) -> None:
    """MariaDB raises 1205 for NOWAIT too (pinned on the real server in test_backend_mariadb.py)."""
    exc = django_wrapped(mysqldb, mysqldb.OperationalError(1205, MYSQL[0][1]))
    assert classify(exc, nowait=True) is F.LOCK_NOT_AVAILABLE
    assert classify(exc, nowait=False) is F.LOCK_TIMEOUT


def test_every_non_postgresql_row_is_pinned_here_or_on_a_real_server() -> None:
    pinned = (
        {("oracle", str(code)) for code, _, _ in ORACLE}
        | {("mysql", str(number)) for number, _, _ in MYSQL}
        | {("sqlite", code) for code in ("5", "261", "517", "773", "6", "262", "8")}
    )
    assert {(row.vendor, row.code) for row in CODES if row.vendor != "postgresql"} == pinned


@pytest.mark.parametrize(
    ("code", "failure"),
    [
        (5, F.LOCK_TIMEOUT),
        (261, F.LOCK_TIMEOUT),
        (517, F.SERIALIZATION_FAILURE),
        (773, F.LOCK_TIMEOUT),
        (6, F.LOCK_TIMEOUT),
        (262, F.LOCK_TIMEOUT),
        (8, F.READ_ONLY),
    ],
)
def test_sqlite_extended_codes(code: int, failure: Failure) -> None:
    import sqlite3

    driver_error = sqlite3.OperationalError("database is locked")
    driver_error.sqlite_errorcode = code  # set by the sqlite3 module on errors from the library
    exc = django_wrapped(sqlite3, driver_error)
    assert classify(exc) is failure
