"""classify() and the SQLSTATE table: pinned row by row, on real server errors through psycopg 3 and psycopg2."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg2
import pytest
from django.db import DatabaseError, connection
from django.db.transaction import TransactionManagementError

import lockkit
from lockkit import Failure
from lockkit.errorcodes import table as codes
from lockkit.errorcodes.table import code_of, lookup
from lockkit.errorcodes.translate import translate, translating
from lockkit.errors import error_class
from lockkit_tests.support.util import raise_sqlstate

PG_CASES = [
    # (SQLSTATE, nowait, failure, lockkit error)
    ("55P03", True, Failure.LOCK_NOT_AVAILABLE, lockkit.LockNotAvailable),
    ("55P03", False, Failure.LOCK_TIMEOUT, lockkit.LockTimeout),
    ("40P01", False, Failure.DEADLOCK_DETECTED, lockkit.DeadlockDetected),
    ("40001", False, Failure.SERIALIZATION_FAILURE, lockkit.SerializationFailure),
    ("57014", False, Failure.QUERY_CANCELED, lockkit.QueryCanceled),  # no statement timeout set: a cancel
    ("57P01", False, Failure.CONNECTION_LOST, lockkit.ConnectionLost),
    ("08006", False, Failure.CONNECTION_LOST, lockkit.ConnectionLost),  # found through its class, 08
    ("25006", False, Failure.READ_ONLY, lockkit.ReadOnlyDatabase),
]


def _server_error(code: str) -> DatabaseError:
    try:
        raise_sqlstate(code)
    except DatabaseError as exc:
        return exc
    raise AssertionError("the server raised nothing")


def _params() -> dict[str, Any]:
    settings = connection.settings_dict
    return {
        "dbname": settings["NAME"],
        "user": settings["USER"] or None,
        "host": settings["HOST"] or None,
        "port": settings["PORT"] or None,
    }


@pytest.fixture
def psycopg3_cursor() -> Iterator[Any]:
    with psycopg.connect(**_params(), autocommit=True) as raw:
        yield raw.cursor()


@pytest.fixture
def psycopg2_cursor() -> Iterator[Any]:
    raw = psycopg2.connect(**{k: v for k, v in _params().items() if v is not None})
    raw.autocommit = True
    try:
        yield raw.cursor()
    finally:
        raw.close()


DO = "DO $$ BEGIN RAISE EXCEPTION 'lockkit test' USING ERRCODE = '{}'; END $$"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("code", "nowait", "failure", "error_class"), PG_CASES)
def test_django_wrapped_psycopg3_errors(
    code: str, nowait: bool, failure: Failure, error_class: type[lockkit.LockError]
) -> None:
    exc = _server_error(code)
    assert lockkit.classify(exc, nowait=nowait) is failure
    assert code_of(exc) == code
    with pytest.raises(error_class) as info, lockkit.locked(nowait=nowait):
        raise_sqlstate(code)
    assert info.value.sqlstate == code
    assert info.value.__cause__ is not None
    assert lockkit.classify(info.value) is failure


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("code", "nowait", "failure", "error_class"), PG_CASES)
def test_bare_psycopg3_errors(
    psycopg3_cursor: Any, code: str, nowait: bool, failure: Failure, error_class: type
) -> None:
    with pytest.raises(psycopg.Error) as info:
        psycopg3_cursor.execute(DO.format(code))
    assert getattr(info.value, "sqlstate", None) == code
    assert lockkit.classify(info.value, nowait=nowait) is failure


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("code", "nowait", "failure", "error_class"), PG_CASES)
def test_bare_psycopg2_errors(
    psycopg2_cursor: Any, code: str, nowait: bool, failure: Failure, error_class: type
) -> None:
    with pytest.raises(psycopg2.Error) as info:
        psycopg2_cursor.execute(DO.format(code))
    assert info.value.pgcode == code
    assert lockkit.classify(info.value, nowait=nowait) is failure


@pytest.mark.django_db(transaction=True)
def test_error_behind_transaction_management_error_is_found() -> None:
    original = _server_error("40P01")
    try:
        raise TransactionManagementError("broken") from original
    except TransactionManagementError as wrapped:
        assert lockkit.classify(wrapped) is Failure.DEADLOCK_DETECTED
    try:
        try:
            raise original
        except DatabaseError:
            raise RuntimeError("while handling") from None
    except RuntimeError as context_only:
        assert lockkit.classify(context_only) is None  # `from None` cuts the chain, as tracebacks show it
        assert context_only.__context__ is original
    try:
        try:
            raise original
        except DatabaseError:
            raise RuntimeError("while handling")  # noqa: B904 - an implicit __context__ is followed
    except RuntimeError as implicit:
        assert lockkit.classify(implicit) is Failure.DEADLOCK_DETECTED


def test_55p03_outside_scope_defaults_to_lock_not_available_and_inside_uses_scope() -> None:
    class FakeDriverError(Exception):
        sqlstate = "55P03"

    FakeDriverError.__module__ = "psycopg.errors"
    assert lockkit.classify(FakeDriverError()) is Failure.LOCK_NOT_AVAILABLE
    assert lockkit.classify(FakeDriverError(), nowait=False) is Failure.LOCK_TIMEOUT


def test_unknown_and_non_database_errors_are_none() -> None:
    assert lockkit.classify(ValueError("x")) is None
    assert lookup(KeyError("y")) is None

    class Unknown(Exception):
        sqlstate = "22012"

    Unknown.__module__ = "psycopg.errors"
    assert lockkit.classify(Unknown()) is None
    assert code_of(Unknown()) == "22012"


def test_cyclic_chain_terminates() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert lockkit.classify(a) is None


def test_lockkit_errors_are_operational_errors_and_misuse_is_transaction_management() -> None:
    from django.db import OperationalError

    for cls in (
        lockkit.LockNotAvailable,
        lockkit.LockTimeout,
        lockkit.DeadlockDetected,
        lockkit.SerializationFailure,
        lockkit.StatementTimeout,
        lockkit.ReadOnlyDatabase,
    ):
        assert issubclass(cls, lockkit.LockError)
        assert issubclass(cls, OperationalError)
    for misuse in (lockkit.AliasMismatch, lockkit.NotInLockedScope):
        assert issubclass(misuse, lockkit.LockError)
        assert issubclass(misuse, TransactionManagementError)
    assert issubclass(lockkit.LockTimeout, lockkit.TransientLockError)
    assert not issubclass(lockkit.ReadOnlyDatabase, lockkit.TransientLockError)


def test_every_failure_kind_has_exactly_one_registered_error_class() -> None:
    for failure in Failure:
        cls = error_class(failure)
        assert cls.failure is failure
        assert issubclass(cls, lockkit.LockError)
    assert error_class(Failure.LOCK_TIMEOUT) is lockkit.LockTimeout


def test_a_second_class_declaring_a_kind_is_refused() -> None:
    with pytest.raises(TypeError, match="LockTimeout"):

        class AnotherLockTimeout(lockkit.TransientLockError):
            failure = Failure.LOCK_TIMEOUT

    assert error_class(Failure.LOCK_TIMEOUT) is lockkit.LockTimeout


@pytest.mark.django_db
def test_public_classify_asks_the_scope_and_pure_classify_does_not() -> None:
    exc = psycopg.errors.LockNotAvailable("held")
    with lockkit.locked(nowait=False):
        assert lockkit.classify(exc) is Failure.LOCK_TIMEOUT  # the innermost scope's nowait
        assert codes.classify(exc) is Failure.LOCK_NOT_AVAILABLE  # the code's own meaning
    assert codes.classify(exc, nowait=False) is Failure.LOCK_TIMEOUT


def test_translating_names_the_alias_and_passes_other_errors_through() -> None:
    with pytest.raises(lockkit.DeadlockDetected) as info:
        with translating("other", nowait=False, attempts=3):
            raise DatabaseError("boom") from psycopg.errors.DeadlockDetected("boom")
    error = info.value
    assert (error.alias, error.attempts, error.sqlstate) == ("other", 3, "40P01")
    assert str(error) == "deadlock_detected on database 'other': boom"
    assert isinstance(error.__cause__, DatabaseError)
    with pytest.raises(lockkit.NotInLockedScope) as misuse:
        with translating("other", nowait=False):
            raise lockkit.NotInLockedScope("no scope")
    assert misuse.value.alias == "other"
    with pytest.raises(ValueError, match="plain"), translating("other", nowait=False):
        raise ValueError("plain")
    assert translate(DatabaseError("no code"), alias="other", nowait=False) is None
