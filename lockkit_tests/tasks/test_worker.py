"""The worker's side of django-tasks' database-backend scenarios, and lockkit's retries and fencing, on every vendor.

Ported from django-tasks' ``DatabaseBackendWorkerTestCase`` and ``DatabaseTaskResultTestCase``
(``tests/tests/test_database_backend.py``): the worker runs in this process (``Worker(..., burst=True)``, on
its own threads and connections), against PostgreSQL, MariaDB and SQLite.
"""

from __future__ import annotations

import logging
import re
import threading
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.tasks import TaskResultStatus
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from lockkit.claims import claim_next, complete
from lockkit.errors import StaleClaim
from lockkit.tasks import outcomes
from lockkit.tasks.models import QueuedTask
from lockkit.tasks.worker import Worker
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, rows, run_worker, status_of, tasks_setting, vendor_aliases

pytestmark = pytest.mark.parametrize("alias", vendor_aliases())


def test_run_enqueued_task(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.calculate_meaning_of_life.enqueue()
        stats = run_worker(backend, worker_id="worker-1")
        assert stats.succeeded == 1
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 42
        assert result.worker_ids == ["worker-1"]
        assert result.errors == []
        row = QueuedTask.objects.using(alias).get()
        assert row.lease_expires_at is None  # the claim ended with the result
        assert row.attempts == 1


def test_async_task_runs(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.noop_task_async.enqueue(1, two=2)
        assert run_worker(backend).succeeded == 1
        assert status_of(result) == TaskResultStatus.SUCCESSFUL


def test_batch_processes_all_tasks(alias: str) -> None:
    with backend_on(alias) as backend:
        for _ in range(5):
            jobs.noop_task.enqueue()
        jobs.failing_task_value_error.enqueue()
        stats = run_worker(backend, concurrency=2, batch=4)
        assert (stats.succeeded, stats.failed) == (5, 1)
        assert {row.status for row in rows(alias)} == {TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED}


def test_no_tasks(alias: str) -> None:
    with backend_on(alias) as backend:
        stats = run_worker(backend)
        assert list(stats.ids) == []


def test_a_long_running_worker_keeps_only_the_latest_ids(alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Stats.ids`` is bounded (``IDS_KEPT``): a worker that runs for months does not grow with every task."""
    monkeypatch.setattr(outcomes, "IDS_KEPT", 3)
    with backend_on(alias) as backend:
        enqueued = [jobs.noop_task.using(priority=-n).enqueue().id for n in range(5)]  # run in this order
        stats = run_worker(backend)
        assert stats.succeeded == 5
        assert list(stats.ids) == enqueued[2:]


@pytest.mark.parametrize(("lease", "interval"), [(6, 2.0), (60, 10.0)])
def test_the_heartbeat_renews_every_third_of_the_lease_every_10_s_at_most(
    alias: str, lease: int, interval: float
) -> None:
    """What a worker keeps of the claims it ended lasts until its next beat: a long lease does not stretch it."""
    with backend_on(alias) as backend:
        done = jobs.noop_task.enqueue()
        worker = Worker(backend, queues=sorted(backend.queues), burst=True, lease=lease)
        assert worker.run().succeeded == 1
        assert worker._beat is not None
        assert worker._beat.interval == pytest.approx(interval)
        assert status_of(done) == TaskResultStatus.SUCCESSFUL


def test_doesnt_process_different_queue(alias: str) -> None:
    with backend_on(alias) as backend:
        other = jobs.noop_task.using(queue_name="queue-1").enqueue()
        run_worker(backend, queues=["default"])
        assert status_of(other) == TaskResultStatus.READY
        run_worker(backend, queues=["queue-1"])
        assert status_of(other) == TaskResultStatus.SUCCESSFUL


def test_process_all_queues(alias: str) -> None:
    with backend_on(alias) as backend:
        first = jobs.noop_task.enqueue()
        second = jobs.noop_task.using(queue_name="queue-1").enqueue()
        assert set(run_worker(backend).ids) == {first.id, second.id}


def test_failing_task(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.failing_task_value_error.enqueue()
        run_worker(backend)
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        with pytest.raises(ValueError, match="Task failed"):
            _ = result.return_value
        assert result.finished_at is not None
        [error] = result.errors
        assert error.exception_class_path == "builtins.ValueError"
        assert error.exception_class is ValueError
        assert "This task failed due to ValueError" in error.traceback
        assert error.traceback.startswith("Traceback (most recent call last):")


def test_complex_exception(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.complex_exception.enqueue()
        run_worker(backend)
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[0].exception_class is jobs.ComplexError


def test_complex_return_value(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.complex_return_value.enqueue()
        run_worker(backend)
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[0].exception_class is TypeError
        assert "the return value is not JSON serializable" in result.errors[0].traceback


def test_system_exit_task_fails_without_stopping_the_worker(alias: str) -> None:
    with backend_on(alias) as backend:
        exiting = jobs.exit_task.enqueue()
        after = jobs.noop_task.enqueue()
        run_worker(backend, concurrency=1, batch=1)
        exiting.refresh()
        after.refresh()
        assert exiting.status == TaskResultStatus.FAILED
        assert exiting.errors[0].exception_class is SystemExit
        assert after.status == TaskResultStatus.SUCCESSFUL


def test_doesnt_process_different_backend(alias: str) -> None:
    with backend_on(alias) as backend:
        jobs.noop_task.enqueue()
        QueuedTask.objects.using(alias).update(backend_name="other")
        assert list(run_worker(backend).ids) == []
        assert QueuedTask.objects.using(alias).get().status == TaskResultStatus.READY


def test_run_after(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.noop_task.using(run_after=timezone.now() + timedelta(hours=10)).enqueue()
        assert list(run_worker(backend).ids) == []
        QueuedTask.objects.using(alias).update(ready_at=timezone.now() - timedelta(seconds=1))
        assert list(run_worker(backend).ids) == [result.id]
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.task.run_after is not None  # the task's own run_after is kept


def test_takes_context(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.context_task.enqueue(marker="m")
        run_worker(backend)
        result.refresh()
        assert result.return_value == {"attempt": 1, "id": result.id, "marker": "m"}


def test_failures_retry_with_backoff_up_to_max_attempts(alias: str) -> None:
    with backend_on(alias, max_attempts=3, retry_backoff=0.2) as backend:
        result = jobs.fail_until.enqueue(succeed_on=2)
        started = timezone.now()
        stats = run_worker(backend)  # burst: attempt 1 fails; the retry is not ready yet
        assert (stats.retried, stats.succeeded) == (1, 0)
        row = QueuedTask.objects.using(alias).get()
        assert row.status == TaskResultStatus.READY
        assert row.ready_at is not None
        assert row.ready_at >= started + timedelta(seconds=0.15)
        assert row.lease_expires_at is None
        result.refresh()
        assert result.attempts == 1
        assert [e.exception_class for e in result.errors] == [RuntimeError]
        QueuedTask.objects.using(alias).update(ready_at=None)
        run_worker(backend)
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 2
        assert result.attempts == 2


def test_a_retried_attempt_logs_its_error(alias: str, caplog: pytest.LogCaptureFixture) -> None:
    """The retry's log line names the exception and its message (a new user's trial: it said only "failed")."""
    with backend_on(alias, max_attempts=2, retry_backoff=60) as backend:
        result = jobs.fail_until.enqueue(succeed_on=5)
        with caplog.at_level(logging.WARNING, logger="lockkit.tasks"):
            run_worker(backend)
        lines = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
        result.refresh()
        (error,) = result.errors
        last_line = error.traceback.rstrip().splitlines()[-1]
        assert lines == [f"task {result.id}: attempt 1 failed with {last_line}; retrying in 60s"]
        assert "attempt 1 fails" in last_line


def test_a_task_that_fails_for_good_logs_it_at_error(alias: str, caplog: pytest.LogCaptureFixture) -> None:
    """A new user's trial: the last failure printed nothing (only the retries did), so a running worker hid it."""
    with backend_on(alias, max_attempts=2, retry_backoff=0.01) as backend:
        result = jobs.fail_until.enqueue(succeed_on=5)
        with caplog.at_level(logging.WARNING, logger="lockkit.tasks"):
            run_worker(backend)
            QueuedTask.objects.using(alias).update(ready_at=None)
            run_worker(backend)
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        last_line = result.errors[-1].traceback.rstrip().splitlines()[-1]
        failed = [r for r in caplog.records if "FAILED after" in r.getMessage()]
        assert [(r.levelno, r.getMessage()) for r in failed] == [
            (
                logging.ERROR,
                f"task {result.id} (lockkit_tests.tasks.jobs.fail_until): FAILED after 2 attempt(s), the last "
                f"with {last_line}",
            )
        ]


def test_last_failure_is_final(alias: str) -> None:
    with backend_on(alias, max_attempts=2, retry_backoff=0.01) as backend:
        result = jobs.fail_until.enqueue(succeed_on=5)
        run_worker(backend)
        QueuedTask.objects.using(alias).update(ready_at=None)
        run_worker(backend)
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert result.attempts == 2
        assert ["attempt 1 fails" in e.traceback for e in result.errors] == [True, False]
        assert "attempt 2 fails" in result.errors[1].traceback


def test_stale_worker_never_overwrites_a_newer_result(alias: str) -> None:
    """A claim whose lease expired is taken by the next worker; the old claim's completion is refused."""
    with backend_on(alias, lease=1) as backend:
        result = jobs.calculate_meaning_of_life.enqueue()
        queryset = QueuedTask.objects.using(alias).filter(status=TaskResultStatus.READY)
        [(_row, stale)] = claim_next(
            queryset, worker="frozen", lease=1, set={"status": TaskResultStatus.RUNNING}, fetch=True
        )
        QueuedTask.objects.using(alias).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        stats = run_worker(backend, worker_id="fresh")
        assert stats.succeeded == 1
        # The refusal says what happened to the row (on MariaDB too, where the claim's pk came back as a str).
        with pytest.raises(StaleClaim, match="the later claim of worker 'fresh' with token 2"):
            complete(stale, set={"status": TaskResultStatus.FAILED})
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 42
        assert result.worker_ids == ["fresh"]  # "frozen" claimed with claim_next directly, not as a worker


def test_command_options_checked(alias: str) -> None:
    with override_settings(TASKS=tasks_setting(alias)):
        with pytest.raises(
            CommandError, match=r"--backend 'missing' is not an alias of settings.TASKS \('default'\)"
        ):
            call_command("lockkit_worker", "--backend", "missing", "--burst")
        with pytest.raises(CommandError, match="queues must name queues of backend 'default'"):
            call_command("lockkit_worker", "--queue", "nope", "--burst")
        with pytest.raises(CommandError, match="--concurrency must be a whole number from 1 to 256, got '0'"):
            call_command("lockkit_worker", "--concurrency", "0", "--burst")
        with pytest.raises(
            CommandError, match=re.escape("--lease must be a number from 1 to 86400, got '0.1'")
        ):
            call_command("lockkit_worker", "--lease", "0.1", "--burst")
        with pytest.raises(CommandError, match="worker_id must be 1 to 255 characters"):
            call_command("lockkit_worker", "--worker-id", "x" * 256, "--burst")
    immediate = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    with (
        override_settings(TASKS=immediate),
        pytest.raises(CommandError, match=r"not lockkit\.tasks\.DatabaseBackend"),
    ):
        call_command("lockkit_worker", "--burst")


@pytest.mark.parametrize(
    ("argv", "kwargs", "message"),
    [
        (["--concurrency", "257"], {}, r"--concurrency must be a whole number from 1 to 256, got '257'"),
        (["--concurrency", "four"], {}, r"--concurrency must be a whole number from 1 to 256, got 'four'"),
        (["--concurrency", "1.5"], {}, r"--concurrency must be a whole number from 1 to 256, got '1.5'"),
        ([], {"concurrency": 0}, r"--concurrency must be a whole number from 1 to 256, got 0"),
        ([], {"concurrency": 2.5}, r"--concurrency must be a whole number from 1 to 256, got 2.5"),
        (["--claim-batch", "0"], {}, r"--claim-batch must be a whole number from 1 to 1000, got '0'"),
        (["--claim-batch", "1001"], {}, r"--claim-batch must be a whole number from 1 to 1000, got '1001'"),
        (["--claim-batch", "-3"], {}, r"--claim-batch must be a whole number from 1 to 1000, got '-3'"),
        ([], {"claim_batch": "many"}, r"--claim-batch must be a whole number from 1 to 1000, got 'many'"),
        (["--lease", "86401"], {}, r"--lease must be a number from 1 to 86400, got '86401'"),
        (["--lease", "nan"], {}, r"--lease must be a number from 1 to 86400, got 'nan'"),
        (["--lease", "inf"], {}, r"--lease must be a number from 1 to 86400, got 'inf'"),
        (["--lease", "soon"], {}, r"--lease must be a number from 1 to 86400, got 'soon'"),
        ([], {"lease": 0}, r"--lease must be a number from 1 to 86400, got 0"),
    ],
)
def test_command_numeric_options_bounded_before_sql_and_threads(
    alias: str, argv: list[str], kwargs: dict[str, Any], message: str
) -> None:
    """Out of range or not a number: a CommandError naming the option and its range; no SQL, no thread."""
    with override_settings(TASKS=tasks_setting(alias)):
        jobs.noop_task.enqueue()
        threads = set(threading.enumerate())
        with CaptureQueriesContext(connections[alias]) as queries:
            with pytest.raises(CommandError, match=re.escape(message)):
                call_command("lockkit_worker", *argv, "--burst", **kwargs)
        assert len(queries) == 0, [query["sql"] for query in queries]
        # No thread started (an earlier test's thread ending meanwhile is not this call's doing).
        assert set(threading.enumerate()) - threads == set()
        assert [row.status for row in rows(alias)] == [TaskResultStatus.READY]  # nothing claimed


def test_command_numeric_options_at_their_bounds_run(alias: str) -> None:
    with override_settings(TASKS=tasks_setting(alias)):
        jobs.noop_task.enqueue()
        out = StringIO()
        call_command(
            "lockkit_worker",
            "--burst",
            "--concurrency",
            "1",
            "--claim-batch",
            "1000",
            "--lease",
            "86400",
            "--worker-id",
            "edges",
            stdout=out,
        )
        assert "worker edges: 1 succeeded, 0 failed" in out.getvalue()


def test_command_burst(alias: str) -> None:
    with override_settings(TASKS=tasks_setting(alias)):
        jobs.noop_task.enqueue()
        jobs.noop_task.using(queue_name="queue-1").enqueue()
        out = StringIO()
        call_command("lockkit_worker", "--burst", "--queue", "default", "--worker-id", "cmd", stdout=out)
        assert "worker cmd: 1 succeeded, 0 failed" in out.getvalue()
        assert sorted(row.status for row in rows(alias)) == [
            TaskResultStatus.READY,
            TaskResultStatus.SUCCESSFUL,
        ]


def test_worker_arguments_checked(alias: str) -> None:
    with backend_on(alias) as backend:
        cases: list[tuple[dict[str, Any], type[Exception]]] = [
            ({"concurrency": True}, TypeError),
            ({"batch": 0}, ValueError),
            ({"queues": []}, ValueError),
            ({"worker_id": "a\nb"}, ValueError),
            ({"worker_id": ""}, ValueError),
            ({"lease": float("inf")}, ValueError),
            ({"lease": float("nan")}, ValueError),
            ({"lease": "30"}, TypeError),
        ]
        for kwargs, error in cases:
            options: dict[str, Any] = {"queues": ["default"], **kwargs}
            with pytest.raises(error):
                Worker(backend, **options)
        # poll_interval (new): refused naming it, before any thread or SQL.
        bad: list[tuple[Any, type[Exception]]] = [
            (0, ValueError),
            (-1, ValueError),
            (float("nan"), ValueError),
            ("1", TypeError),
        ]
        for value, error in bad:
            with pytest.raises(error, match="poll_interval"):
                Worker(backend, queues=["default"], poll_interval=value)
        assert Worker(backend, queues=["default"], poll_interval=0.25).poll_interval == 0.25
