"""The claims tests' vendors (PostgreSQL, MariaDB, SQLite) and per-alias helpers: the clock, expiring a lease."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from lockkit.claims.sql import claims_sql_for
from lockkit_tests.models import Job
from lockkit_tests.support.vendors import vendor_params

# The clock each vendor's claims read (see the ClaimsSQL.now() of each).
_CLOCK = {
    "postgresql": "SELECT statement_timestamp()",
    "mysql": "SELECT UTC_TIMESTAMP(6)",
    "sqlite": "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')",
}


def claims_vendor_params() -> list[Any]:
    """PostgreSQL, MariaDB (skipped with its reason when not configured) and SQLite, each transactional."""
    sqlite = pytest.param(
        "sqlite",
        id="sqlite",
        marks=[pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])],
    )
    return [*vendor_params(), sqlite]


def db_now(alias: str) -> datetime:
    """The database clock of ``alias``, as claims read it (aware)."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(_CLOCK[connection.vendor])
        row = cursor.fetchone()
    assert row is not None
    value: Any = row[0]
    if isinstance(value, str):
        value = parse_datetime(value)
    assert isinstance(value, datetime)
    if settings.USE_TZ and timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    result: datetime = value
    return result


def wait_for_clock(alias: str, moment: datetime, *, timeout: float = 10.0) -> datetime:
    """Return once ``alias``'s clock is past ``moment``; fail after ``timeout`` seconds of real time."""
    deadline = time.monotonic() + timeout
    while (now := db_now(alias)) <= moment:
        assert time.monotonic() < deadline, f"the clock of {alias!r} did not pass {moment} (it says {now})"
        time.sleep(0.02)
    return now


def expire(alias: str, *pks: Any) -> None:
    """Make the claims on ``pks`` lapse now, on the database clock (as if their lease had run out)."""
    now = claims_sql_for(Job, alias).now()
    updated = (
        Job.objects.using(alias)
        .filter(pk__in=pks, lease_expires_at__isnull=False)
        .update(lease_expires_at=now - timedelta(seconds=1))
    )
    assert updated == len(pks)
