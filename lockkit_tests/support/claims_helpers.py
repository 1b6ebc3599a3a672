"""Helpers shared by the claims tests: database-clock waits, expiring a lease, and a child-process worker."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.test.utils import CaptureQueriesContext

from lockkit.claims.sql.base import StatementTimestamp
from lockkit_tests.models import Job


def db_now(using: str = "default") -> datetime:
    """The database clock, as claims read it."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        row = cursor.fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def wait_for_db_clock(moment: datetime, *, timeout: float = 10.0, poll: float = 0.02) -> datetime:
    """Return once the database clock is past ``moment``; fail after ``timeout`` seconds of real time."""
    deadline = time.monotonic() + timeout
    while True:
        now = db_now()
        if now > moment:
            return now
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the database clock did not pass {moment} within {timeout}s (it says {now})"
            )
        time.sleep(poll)


def expire(pk: Any) -> None:
    """Make a claim's lease lapse now (as if its time had passed), without waiting."""
    updated = Job.objects.filter(pk=pk, lease_expires_at__isnull=False).update(
        lease_expires_at=StatementTimestamp() - timedelta(seconds=1)
    )
    assert updated == 1


def snapshot(pk: Any) -> dict[str, Any]:
    """Every column of a job row, to compare before and after an operation that must change nothing."""
    return dict(Job.objects.filter(pk=pk).values().get())


def claims_statements(queries: CaptureQueriesContext, *, stale: bool = False) -> list[str]:
    """The claims statements among ``queries`` (one claims call).

    Outside a transaction a PostgreSQL claims call of one statement is one message,
    ``BEGIN; SELECT set_config('lock_timeout', ...); <statement>; COMMIT``; a call of several statements
    (``claim()``) runs in a scope of its own: BEGIN (Django's log line), the scope's opening, the statements,
    COMMIT. A ``StaleClaim`` then reads who holds the stale rows (``stale``).
    """
    sql = [query["sql"] for query in queries.captured_queries]
    if stale:
        assert '"claimed_by"' in sql[-1]  # StaleClaim.holders, read after the transaction
        sql = sql[:-1]
    if sql[0] == "BEGIN":
        assert sql[1].startswith("BEGIN; SELECT set_config('lock_timeout', '"), sql[1]
        assert sql[-1] == "COMMIT"
        return sql[2:-1]
    (message,) = sql
    opening, sent, statement = message.partition(MESSAGE_AFTER)
    assert opening.startswith("BEGIN; SELECT set_config('lock_timeout', '"), message
    assert sent, message
    assert statement.endswith("; COMMIT"), message
    return [statement.removesuffix("; COMMIT")]


#: What ends a claims message's opening (the last ``set_config(..., true)``), before its statement.
MESSAGE_AFTER = "true); "
