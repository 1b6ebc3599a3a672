"""Timeouts the server enforces that lockkit did not set (issue 23, items 5 and 6).

A ``statement_timeout`` from any source (the session, ``SET LOCAL`` in the body, the connection's options) is a
``StatementTimeout``; a cancel during a statement timeout lockkit set is still a ``QueryCanceled``; the public
``classify()`` tells them apart on a plain Django error. An ``idle_in_transaction_session_timeout`` termination is
an ``IdleInTransactionTimeout``, not retried, and the next call works.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connections

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.testing import backend_pid, in_thread
from lockkit_tests.faults.test_cancel import JOIN, _cancel_when_sleeping
from lockkit_tests.support.faultkit import wait_until_gone

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


def _sleep() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_sleep(30)")


def _next_call_works() -> None:
    with lockkit.locked() as scope, connections["default"].cursor() as cursor:
        cursor.execute("SELECT 41 + 1")
        assert cursor.fetchone() == (42,)
        assert scope.alias == "default"


def test_a_session_statement_timeout_lockkit_did_not_set_is_a_statement_timeout() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SET statement_timeout = '200ms'"
        )  # a role/database default or OPTIONS behave the same
    try:
        with pytest.raises(lockkit.StatementTimeout) as caught, lockkit.locked():
            _sleep()
        assert caught.value.sqlstate == "57014"
        assert lockkit.classify(caught.value) is Failure.STATEMENT_TIMEOUT
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute("RESET statement_timeout")
    _next_call_works()


def test_set_local_statement_timeout_in_the_body_is_a_statement_timeout_and_not_retried() -> None:
    events: list[RetryEvent] = []
    calls = []

    @lockkit.locked_operation(retry=RetryPolicy(before_retry=events.append))
    def body() -> None:
        calls.append(1)
        with connections["default"].cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '200ms'")
        _sleep()

    with pytest.raises(lockkit.StatementTimeout):
        body()
    assert (calls, events) == ([1], [])
    _next_call_works()


def test_a_cancel_during_a_statement_timeout_lockkit_set_is_query_canceled() -> None:
    connections["default"].ensure_connection()
    canceller = in_thread(_cancel_when_sleeping, "default", backend_pid("default"))
    with pytest.raises(lockkit.LockError) as caught, lockkit.locked(statement_timeout=25):
        _sleep()
    assert canceller.result(JOIN) is True
    assert type(caught.value) is lockkit.QueryCanceled
    _next_call_works()


def test_classify_tells_a_plain_django_statement_timeout_from_a_cancel() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SET statement_timeout = '100ms'")
        try:
            with pytest.raises(DatabaseError) as timed_out:
                cursor.execute("SELECT pg_sleep(30)")
        finally:
            cursor.execute("RESET statement_timeout")
    assert lockkit.classify(timed_out.value) is Failure.STATEMENT_TIMEOUT
    canceller = in_thread(_cancel_when_sleeping, "default", backend_pid("default"))
    with connections["default"].cursor() as cursor, pytest.raises(DatabaseError) as cancelled:
        cursor.execute("SELECT pg_sleep(30)")
    assert canceller.result(JOIN) is True
    assert lockkit.classify(cancelled.value) is Failure.QUERY_CANCELED


def test_an_idle_in_transaction_termination_is_its_own_kind_and_not_retried() -> None:
    events: list[RetryEvent] = []
    calls = []

    @lockkit.locked_operation(retry=RetryPolicy(before_retry=events.append))
    def slow_body() -> None:
        calls.append(1)
        with connections["default"].cursor() as cursor:
            cursor.execute("SET LOCAL idle_in_transaction_session_timeout = '100ms'")
            session = backend_pid("default")
            # The body's "external call": the server ends the idle session meanwhile (observed, not slept for).
            wait_until_gone("default", session)
            cursor.execute("SELECT 1")

    with pytest.raises(lockkit.IdleInTransactionTimeout) as caught:
        slow_body()
    assert (calls, events) == ([1], [])  # retrying would repeat the slow body and its external effects
    error = caught.value
    # psycopg 3.2+ gives the server's code; 3.1 raises the FATAL without one, recognised by its text.
    assert error.sqlstate in ("25P03", None)
    assert isinstance(error, lockkit.ConnectionLost)  # the connection is gone either way
    assert lockkit.classify(error) is Failure.IDLE_IN_TRANSACTION_TIMEOUT
    assert "idle_in_transaction_session_timeout" in str(error)
    assert "nothing committed" in str(error)
    _next_call_works()


def test_idle_in_transaction_is_retried_when_asked() -> None:
    calls = []

    @lockkit.locked_operation(retry=RetryPolicy(retry_on={Failure.IDLE_IN_TRANSACTION_TIMEOUT}))
    def body() -> int:
        calls.append(1)
        with connections["default"].cursor() as cursor:
            if len(calls) == 1:
                cursor.execute("SET LOCAL idle_in_transaction_session_timeout = '100ms'")
                wait_until_gone("default", backend_pid("default"))
            cursor.execute("SELECT 7")
            row = cursor.fetchone()
        assert row is not None
        return int(row[0])

    assert body() == 7
    assert len(calls) == 2
