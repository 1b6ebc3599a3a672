"""Values a database refuses to store: a task's outcome is still recorded, its worker carries on.

A return value or an exception message that the task table's JSON columns cannot hold (a lone surrogate, a NUL,
megabytes, nesting MariaDB refuses) must fail that attempt (or be stored escaped and cut), never leave the task
``RUNNING`` under a claim the worker's heartbeat keeps renewing, nor stop the worker. On every vendor.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError
from django.tasks import TaskResultStatus

from lockkit.tasks.arguments import MAX_TEXT
from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, run_worker, status_of, vendor_aliases

ALIASES = vendor_aliases()
MARIADB = [param for param in ALIASES if param.id == "mariadb"]


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize(
    ("kind", "stored"),
    [("nul", "a \\x00 NUL"), ("surrogate", "a \\ud800 surrogate"), ("huge", "characters cut")],
)
def test_an_exception_message_no_database_stores_is_recorded_escaped(
    alias: str, kind: str, stored: str
) -> None:
    with backend_on(alias) as backend:
        result = jobs.raise_unstorable_message.enqueue(kind)
        after = jobs.calculate_meaning_of_life.enqueue()
        stats = run_worker(backend, concurrency=1, batch=1)
        assert (stats.failed, stats.succeeded) == (1, 1)
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        [error] = result.errors
        assert error.exception_class is RuntimeError
        assert stored in error.traceback
        assert len(error.traceback) <= MAX_TEXT + 100
        assert error.traceback.startswith("Traceback (most recent call last):")
        assert status_of(after) == TaskResultStatus.SUCCESSFUL
        assert QueuedTask.objects.using(alias).get(pk=result.id).lease_expires_at is None


@pytest.mark.parametrize("alias", ALIASES)
def test_a_return_value_no_database_stores_fails_the_attempt(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.return_lone_surrogate.enqueue()
        after = jobs.calculate_meaning_of_life.enqueue()
        stats = run_worker(backend, concurrency=1, batch=1)
        assert (stats.failed, stats.succeeded) == (1, 1)
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[0].exception_class is ValueError
        assert "the return value must be valid Unicode text: a lone surrogate" in result.errors[0].traceback
        assert status_of(after) == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("alias", MARIADB)
@pytest.mark.parametrize("concurrency", [1, 2], ids=["alone", "batched"])
def test_a_return_value_the_server_refuses_fails_the_attempt_and_ends_the_claim(
    alias: str, concurrency: int
) -> None:
    # 20 MB is more than MariaDB's default max_allowed_packet (16 MB): the completion is refused by the server.
    with backend_on(alias) as backend:
        result = jobs.return_text.enqueue(20_000_000)
        after = jobs.calculate_meaning_of_life.enqueue()
        stats = run_worker(backend, concurrency=concurrency, batch=concurrency)
        assert (stats.failed, stats.succeeded) == (1, 1)
        row = QueuedTask.objects.using(alias).get(pk=result.id)
        assert (row.status, row.lease_expires_at, row.return_value) == (TaskResultStatus.FAILED, None, None)
        result.refresh()
        assert [error.exception_class_path for error in result.errors] == ["lockkit.errors.ConnectionLost"]
        assert status_of(after) == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("alias", MARIADB)
def test_an_enqueue_the_server_refuses_leaves_the_next_one_working(alias: str) -> None:
    with backend_on(alias):
        with pytest.raises(OperationalError):
            jobs.echo.enqueue("x" * 20_000_000)  # the server closes the connection
        result = jobs.echo.enqueue("small")
        assert status_of(result) == TaskResultStatus.READY
        assert QueuedTask.objects.using(alias).count() == 1


@pytest.mark.parametrize("alias", ALIASES)
def test_the_deepest_arguments_accepted_round_trip_on_every_vendor(alias: str) -> None:
    value: Any = 1
    for _ in range(29):  # with args' own list, 30: the most MAX_DEPTH allows
        value = [value]
    with backend_on(alias) as backend:
        result = jobs.noop_task.enqueue(value)
        run_worker(backend)
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.args == [value]
