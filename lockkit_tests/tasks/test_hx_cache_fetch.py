"""Hostile tests of the kept ``fetch=True`` converters (commit 92938de), on the task table (Django 6).

Moved from ``lockkit_tests/claims/test_hx_cache.py``: the task table needs Django 6. A claim with ``fetch=True`` must
convert values as the ORM does, after a terminated session, in threads with their own connections, and after
``USE_TZ`` changes (MariaDB's date-time converters depend on it; the converters are kept per ``USE_TZ``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from lockkit.claims import claim_next, release
from lockkit.tasks.models import QueuedTask
from lockkit_tests.models import PricedJob
from lockkit_tests.support.util import run_threads
from lockkit_tests.support.vendors import vendor_params

VENDORS = vendor_params()
PG = [pytest.param("default", id="postgresql", marks=pytest.mark.django_db(transaction=True))]
MARIADB = [p for p in VENDORS if p.id == "mariadb"]


def _queued(alias: str) -> QueuedTask:
    return QueuedTask.objects.using(alias).create(
        backend_name="default",
        queue_name="default",
        task_path="x.y",
        args_kwargs={"args": [], "kwargs": {}},
        enqueued_at=timezone.now(),
        errors=[],
        return_value={"n": 1},
    )


@pytest.mark.parametrize("alias", VENDORS)
def test_a_datetime_text_follows_the_default_time_zone(alias: str) -> None:
    row = _queued(alias)
    mine = QueuedTask.objects.using(alias).filter(pk=row.pk)
    seen = []
    for zone in ("UTC", "Asia/Tokyo"):
        with override_settings(TIME_ZONE=zone), pytest.warns(RuntimeWarning, match="naive datetime"):
            (claim,) = claim_next(mine, worker="w", lease=30, set={"ready_at": "2030-01-01 09:00:00"})
        release(claim)
        seen.append(QueuedTask.objects.using(alias).get(pk=row.pk).ready_at)
    assert seen == [datetime(2030, 1, 1, 9, 0, tzinfo=UTC), datetime(2030, 1, 1, 0, 0, tzinfo=UTC)]


# -- fetch=True: converters kept per connection --------------------------------------------------------------------


def _assert_fetched(claim: Any, row: QueuedTask) -> None:
    instance = claim.instance
    assert isinstance(instance, QueuedTask)
    assert instance.return_value == {"n": 1}
    assert instance.args_kwargs == {"args": [], "kwargs": {}}
    assert instance.errors == []
    assert instance.id == row.id
    assert isinstance(instance.id, uuid.UUID)
    assert instance.enqueued_at == row.enqueued_at
    assert instance.enqueued_at.tzinfo is not None
    assert instance.takes_context is False


@pytest.mark.parametrize("alias", PG)
def test_fetch_after_the_session_was_terminated_converts_as_before(alias: str) -> None:
    row = _queued(alias)
    PricedJob.objects.using(alias).create(price=Decimal("2.25"))
    mine = QueuedTask.objects.using(alias).filter(pk=row.pk)
    (claim,) = claim_next(mine, worker="w", lease=30, fetch=True)
    _assert_fetched(claim, row)
    release(claim.claim)
    connection = connections[alias]
    pid = connection.connection.info.backend_pid
    other = connections.create_connection(alias)  # another session ends only ours, by its pid
    try:
        with other.cursor() as killer:
            killer.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
            assert killer.fetchone() == (True,)
    finally:
        other.close()
    # the next call works (lockkit reconnects a dead session outside a transaction) and converts as before
    (claim,) = claim_next(mine, worker="w", lease=30, fetch=True)
    _assert_fetched(claim, row)
    assert connection.connection.info.backend_pid != pid
    (priced,) = claim_next(PricedJob.objects.using(alias).all(), worker="w", lease=30, fetch=True)
    assert priced.instance.price == Decimal("2.25")
    assert isinstance(priced.instance.price, Decimal)


@pytest.mark.parametrize("alias", VENDORS)
def test_fetch_in_threads_with_their_own_connections(alias: str) -> None:
    rows = [_queued(alias) for _ in range(3)]
    errors: list[BaseException] = []
    got: dict[int, Any] = {}

    def run(index: int) -> None:
        try:
            mine = QueuedTask.objects.using(alias).filter(pk=rows[index].pk)
            (claim,) = claim_next(mine, worker=f"w{index}", lease=30, fetch=True)
            got[index] = claim
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(run, 3, timeout=30)
    assert errors == []
    for index in range(3):
        _assert_fetched(got[index], rows[index])
    # and the main thread's connection, after the threads' wrappers were collected
    release(got[0].claim)
    (claim,) = claim_next(
        QueuedTask.objects.using(alias).filter(pk=rows[0].pk), worker="m", lease=30, fetch=True
    )
    _assert_fetched(claim, rows[0])


@pytest.mark.parametrize("alias", MARIADB)
def test_fetch_follows_use_tz(alias: str) -> None:
    row = _queued(alias)
    mine = QueuedTask.objects.using(alias).filter(pk=row.pk)
    (claim,) = claim_next(mine, worker="w", lease=30, fetch=True)
    assert claim.instance.enqueued_at.tzinfo is not None
    release(claim.claim)
    with override_settings(USE_TZ=False):
        (claim,) = claim_next(mine, worker="w", lease=30, fetch=True)
        release(claim.claim)
        plain = QueuedTask.objects.using(alias).get(pk=row.pk)
        assert plain.enqueued_at.tzinfo is None
        assert claim.instance.enqueued_at == plain.enqueued_at
