"""The backend's side of django-tasks' database-backend scenarios (enqueue, results, checks), on every vendor.

Ported from django-tasks' ``tests/tests/test_database_backend.py`` (``DatabaseBackendTestCase``), against
``lockkit.tasks.DatabaseBackend`` on PostgreSQL, MariaDB and SQLite; plus what lockkit adds (arguments refused
before SQL, a transactional enqueue, ``OPTIONS`` checked).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import SuspiciousOperation
from django.db import connections, transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from lockkit.tasks import DatabaseBackend
from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, rows, run_worker, status_of, tasks_setting, vendor_aliases

pytestmark = pytest.mark.parametrize("alias", vendor_aliases())


def _other_connection_count(alias: str) -> int:
    """How many task rows another session sees (committed rows only)."""
    other = connections.create_connection(alias)
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT COUNT(*) FROM {other.ops.quote_name(QueuedTask._meta.db_table)}")
            row = cursor.fetchone()
            assert row is not None
            return int(row[0])
    finally:
        other.close()


def test_using_correct_backend(alias: str) -> None:
    with backend_on(alias) as backend:
        assert default_task_backend.alias == "default"
        assert task_backends["default"] is backend
        assert backend.settings.database == alias
        assert backend.supports_defer
        assert backend.supports_get_result
        assert backend.supports_priority
        assert backend.supports_async_task


@pytest.mark.parametrize("task", [jobs.noop_task, jobs.noop_task_async], ids=["sync", "async"])
def test_enqueue_task(alias: str, task: Any) -> None:
    received: list[Any] = []

    def capture(sender: Any, task_result: Any, **kwargs: Any) -> None:
        received.append((sender, task_result))

    task_enqueued.connect(capture, dispatch_uid="lockkit-enqueue-test", weak=False)
    try:
        with backend_on(alias), CaptureQueriesContext(connections[alias]) as queries:
            result = task.enqueue(1, two=3)
    finally:
        task_enqueued.disconnect(dispatch_uid="lockkit-enqueue-test")
    # One statement: on PostgreSQL the INSERT and the NOTIFY (delivered on commit) together.
    assert len(queries) == 1
    assert uuid.UUID(result.id).version == 4
    assert result.status == TaskResultStatus.READY
    assert not result.is_finished
    assert result.started_at is None
    assert result.last_attempted_at is None
    assert result.finished_at is None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value
    assert result.task == task
    assert result.args == [1]
    assert result.kwargs == {"two": 3}
    assert result.attempts == 0
    assert received == [(DatabaseBackend, result)]


def test_enqueue_task_async(alias: str) -> None:
    with backend_on(alias):
        result = async_to_sync(jobs.noop_task.aenqueue)(1, two=3)
        assert result.status == TaskResultStatus.READY
        assert QueuedTask.objects.using(alias).get().args_kwargs == {"args": [1], "kwargs": {"two": 3}}


def test_get_result(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.noop_task.enqueue()
        fetched = backend.get_result(result.id)
        assert fetched == result
        assert fetched is not result
        assert async_to_sync(backend.aget_result)(result.id) == result
        assert jobs.noop_task.get_result(result.id) == result


def test_refresh_result(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.calculate_meaning_of_life.enqueue()
        run_worker(backend)
        assert result.status == TaskResultStatus.READY  # a value: refresh() reads the row again
        assert status_of(result) == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 42
        assert result.started_at is not None
        assert result.finished_at is not None
        assert result.last_attempted_at is not None
        assert result.started_at <= result.finished_at
        assert result.attempts == 1
        assert len(result.worker_ids) == 1
        again = backend.get_result(result.id)
        async_to_sync(again.arefresh)()
        assert again == result


def test_get_result_reads_only_its_own_backends_tasks(alias: str) -> None:
    # Two lockkit backends sharing one database (one table): each reads its own tasks only, as its workers do.
    entry = tasks_setting(alias)["default"]
    both = {"default": entry, "second": entry}
    with override_settings(TASKS=both):
        first, second = task_backends["default"], task_backends["second"]
        mine = jobs.noop_task.enqueue()
        theirs = jobs.noop_task.using(backend="second").enqueue()
        assert first.get_result(mine.id) == mine
        assert second.get_result(theirs.id) == theirs
        for backend, foreign in ((first, theirs), (second, mine)):
            with pytest.raises(TaskResultDoesNotExist):
                backend.get_result(foreign.id)
            with pytest.raises(TaskResultDoesNotExist):
                async_to_sync(backend.aget_result)(foreign.id)
        # The next call on the same backend still works.
        assert first.get_result(mine.id) == mine


@pytest.mark.parametrize(
    "result_id",
    [str(uuid.uuid4()), "123", "", "not a uuid' OR 1=1 --", "x" * 1000, None, 123, -1, ["a"], "\x00"],
)
def test_get_missing_or_malformed_result(alias: str, result_id: Any) -> None:
    with backend_on(alias) as backend:
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(result_id)
        with pytest.raises(TaskResultDoesNotExist):
            async_to_sync(backend.aget_result)(result_id)


def test_invalid_task_path(alias: str) -> None:
    with backend_on(alias) as backend:
        row = QueuedTask.objects.using(alias).create(
            backend_name="default",
            queue_name="default",
            task_path="subprocess.check_output",
            args_kwargs={"args": [["exit", "1"]], "kwargs": {}},
            enqueued_at=timezone.now(),
        )
        # In no installed app: refused before anything is imported (test_task_paths.py).
        with pytest.raises(InvalidTask, match=r"subprocess\.check_output"):
            backend.get_result(str(row.id))
        not_a_task = QueuedTask.objects.using(alias).create(
            backend_name="default",
            queue_name="default",
            task_path="lockkit_tests.tasks.jobs.ComplexError",
            args_kwargs={"args": [], "kwargs": {}},
            enqueued_at=timezone.now(),
        )
        with pytest.raises(SuspiciousOperation, match=f"Task {not_a_task.id} does not point to a Task"):
            backend.get_result(str(not_a_task.id))
        stats = run_worker(backend)  # the worker never calls them: the tasks fail
        assert stats.failed == 2
        classes = {str(r.pk): r.errors[0]["exception_class_path"] for r in QueuedTask.objects.using(alias)}
        assert classes == {
            str(row.id): "django.tasks.exceptions.InvalidTask",
            str(not_a_task.id): "django.core.exceptions.SuspiciousOperation",
        }


def test_missing_task_path(alias: str) -> None:
    with backend_on(alias) as backend:
        row = QueuedTask.objects.using(alias).create(
            backend_name="default",
            queue_name="default",
            task_path="lockkit_tests.tasks.missing.func",
            args_kwargs={"args": [], "kwargs": {}},
            enqueued_at=timezone.now(),
        )
        with pytest.raises(ImportError):
            backend.get_result(str(row.id))
        assert run_worker(backend).failed == 1
        assert QueuedTask.objects.using(alias).get().status == TaskResultStatus.FAILED


def test_check(alias: str) -> None:
    with backend_on(alias) as backend:
        # A task table off "default" is warned about (no transaction spans the two): lockkit.tasks.W001.
        assert [m.id for m in backend.check()] == ([] if alias == "default" else ["lockkit.tasks.W001"])


def test_enqueue_inside_atomic_is_transactional(alias: str) -> None:
    with backend_on(alias):
        with transaction.atomic(using=alias):
            result = jobs.noop_task.enqueue()
            assert _other_connection_count(alias) == 0  # not committed yet: no worker can see it
        assert _other_connection_count(alias) == 1
        assert QueuedTask.objects.using(alias).get().id == uuid.UUID(result.id)

        class Abort(Exception):
            pass

        with pytest.raises(Abort), transaction.atomic(using=alias):
            jobs.noop_task.enqueue()
            raise Abort
        assert _other_connection_count(alias) == 1  # the rolled-back task does not exist


def test_arguments_normalized_as_django_does(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.echo.enqueue((1, 2), b"bytes", nested={"t": (3,)})
        assert result.args == [[1, 2], "bytes"]
        assert result.kwargs == {"nested": {"t": [3]}}
        run_worker(backend)
        result.refresh()
        assert result.return_value == {"args": [[1, 2], "bytes"], "kwargs": {"nested": {"t": [3]}}}


def test_priority_order_then_fifo(alias: str) -> None:
    with backend_on(alias) as backend:
        now = timezone.now()
        old = jobs.noop_task.using(priority=20, run_after=now - timedelta(hours=2)).enqueue()
        very_old = jobs.noop_task.using(priority=20, run_after=now - timedelta(hours=10)).enqueue()
        jobs.noop_task.using(run_after=now + timedelta(hours=10)).enqueue()
        jobs.noop_task.using(priority=10, run_after=now + timedelta(hours=10)).enqueue()
        high = jobs.noop_task.using(priority=10).enqueue()
        low = jobs.noop_task.using(priority=2).enqueue()
        lower = jobs.noop_task.using(priority=-2).enqueue()
        stats = run_worker(backend, concurrency=1, batch=1)
        # Higher priority first; equal priorities in enqueue order; tasks whose run_after is ahead wait.
        assert list(stats.ids) == [old.id, very_old.id, high.id, low.id, lower.id]
        assert sum(1 for row in rows(alias) if row.status == TaskResultStatus.READY) == 2
