"""A cancelled statement is ``QueryCanceled``; a statement timeout lockkit set is ``StatementTimeout``
(issue 11, item 5). Both arrive as SQLSTATE 57014 on PostgreSQL; the server's primary message tells them apart
(test_server_timeouts.py covers timeouts lockkit did not set).
"""

from __future__ import annotations

import time

import pytest
from django.db import connections
from django.test.utils import override_settings

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.testing import in_thread
from lockkit_harness.sessions import cancel, session_of
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON

JOIN = 30.0
SLEEP = {"postgresql": "SELECT pg_sleep(30)", "mysql": "SELECT SLEEP(30)"}
RUNNING = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND query LIKE '%%SELECT pg_sleep%%'",
    "mysql": "SELECT count(*) FROM information_schema.processlist WHERE id = %s AND info LIKE 'SELECT SLEEP%%'",
}


def _cancel_when_sleeping(alias: str, session: int) -> bool:
    """Wait until ``session`` runs the sleep (seen by the server), then cancel it."""
    control = connections.create_connection(alias)
    deadline = time.monotonic() + JOIN
    try:
        while time.monotonic() < deadline:
            with control.cursor() as cursor:
                cursor.execute(RUNNING[control.vendor], [session])
                row = cursor.fetchone()
            if row is not None and row[0]:
                return cancel(alias, session)
            time.sleep(0.02)
        return False
    finally:
        control.close()


def _sleep_and_get_cancelled(alias: str) -> BaseException:
    events: list[RetryEvent] = []

    @lockkit.locked_operation(alias, retry=RetryPolicy(before_retry=events.append))
    def sleep() -> None:
        with connections[alias].cursor() as cursor:
            cursor.execute(SLEEP[connections[alias].vendor])

    connections[alias].ensure_connection()
    canceller = in_thread(_cancel_when_sleeping, alias, session_of(alias))
    with pytest.raises(lockkit.LockError) as caught:
        sleep()
    assert canceller.result(JOIN) is True
    assert events == []  # neither a cancel nor a timeout is retried
    return caught.value


@pytest.mark.django_db(transaction=True)
def test_pg_cancel_backend_is_query_canceled_not_a_timeout() -> None:
    error = _sleep_and_get_cancelled("default")
    assert type(error) is lockkit.QueryCanceled
    assert error.sqlstate == "57014"
    assert lockkit.classify(error) is Failure.QUERY_CANCELED
    assert not isinstance(error, lockkit.StatementTimeout)


@pytest.mark.django_db(transaction=True)
def test_a_statement_timeout_the_scope_set_is_statement_timeout() -> None:
    with pytest.raises(lockkit.StatementTimeout) as caught, lockkit.locked(statement_timeout=0.2):
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_sleep(30)")
    assert caught.value.sqlstate == "57014"
    assert lockkit.classify(caught.value) is Failure.STATEMENT_TIMEOUT


@pytest.mark.django_db(transaction=True)
def test_a_statement_timeout_from_settings_is_statement_timeout() -> None:
    with override_settings(LOCKKIT={"STATEMENT_TIMEOUT": 0.2}):
        with pytest.raises(lockkit.StatementTimeout), lockkit.locked():
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_sleep(30)")


@pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON)
@pytest.mark.django_db(transaction=True, databases=["default", "mariadb"])
def test_kill_query_on_mariadb_is_query_canceled() -> None:
    error = _sleep_and_get_cancelled("mariadb")
    assert type(error) is lockkit.QueryCanceled
    assert error.sqlstate == "1317"
