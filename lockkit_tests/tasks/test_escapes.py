"""Nothing a task does stops its worker: exceptions from the task, its receivers or its row end that attempt only.

Real ``manage.py lockkit_worker`` processes on PostgreSQL and MariaDB; each test asserts the worker's exit code and
that the tasks after the bad one still run (the next call works).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.tasks import TaskResultStatus, task_backends

from lockkit.tasks import arguments
from lockkit.tasks.models import QueuedTask
from lockkit_tests.models import Owner
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import (
    APPS,
    backend_on,
    run_worker,
    status_of,
    vendor_aliases,
    wait_for,
    worker_process,
)

POSTGRESQL, MARIADB, _SQLITE = vendor_aliases(apps=APPS)


@pytest.mark.parametrize("concurrency", ["1", "2"])
@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_task_raising_keyboard_interrupt_fails_like_any_other(alias: str, concurrency: str) -> None:
    """KeyboardInterrupt raised by the task is its error: retried per max_attempts, then FAILED; the worker lives."""
    opts = {"lease": 5, "max_attempts": 2}
    with backend_on(alias, **opts):
        interrupting = jobs.interrupt_task.enqueue()
        after = [jobs.calculate_meaning_of_life.enqueue() for _ in range(3)]
        args = ("--concurrency", concurrency, "--worker-id", "steady")
        with worker_process(alias, *args, options=opts) as worker:
            wait_for(lambda: status_of(interrupting) == TaskResultStatus.FAILED, what="the task to fail")
            wait_for(lambda: all(status_of(r) == TaskResultStatus.SUCCESSFUL for r in after), what="the rest")
            assert worker.process.poll() is None  # still working
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        assert [e.exception_class_path for e in interrupting.errors] == ["builtins.KeyboardInterrupt"] * 2
        assert [e["attempt"] for e in QueuedTask.objects.using(alias).get(pk=interrupting.id).errors] == [
            1,
            2,
        ]
        assert interrupting.worker_ids == ["steady", "steady"]
        assert not QueuedTask.objects.using(alias).filter(lease_expires_at__isnull=False).exists()


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_task_started_receiver_that_raises_fails_the_attempt(alias: str) -> None:
    opts = {"lease": 5, "max_attempts": 1}
    with backend_on(alias, **opts):
        bombed = jobs.bomb_on_started.enqueue()
        after = jobs.calculate_meaning_of_life.enqueue()
        with worker_process(alias, "--burst", "--worker-id", "receiver", options=opts) as worker:
            code, output = worker.wait()
        assert code == 0, output
        bombed.refresh()
        assert bombed.status == TaskResultStatus.FAILED
        [error] = bombed.errors
        assert error.exception_class_path == "builtins.RuntimeError"
        assert "a task_started receiver failed" in error.traceback
        assert status_of(after) == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
@pytest.mark.parametrize(
    ("errors", "shown"),
    [
        ({"not": "a list"}, "'not': 'a list'"),
        (
            [{"attempt": 1}],
            "'attempt': 1",
        ),  # an entry without its class path and traceback (a KeyError before)
        ([{"exception_class_path": 5, "traceback": ""}], "'exception_class_path': 5"),
    ],
)
def test_a_row_whose_errors_is_not_a_list_fails_the_attempt(alias: str, errors: Any, shown: str) -> None:
    opts = {"lease": 5, "max_attempts": 2}
    with backend_on(alias, **opts):
        broken = jobs.calculate_meaning_of_life.enqueue()
        QueuedTask.objects.using(alias).filter(pk=broken.id).update(errors=errors)
        # Read as it is (get_result), each entry an error: never a KeyError.
        [read] = task_backends[broken.backend].get_result(broken.id).errors
        assert read.traceback.startswith("an unreadable error entry: {")
        assert shown in read.traceback
        after = jobs.calculate_meaning_of_life.enqueue()
        with worker_process(alias, "--worker-id", "reader", options=opts) as worker:
            wait_for(lambda: status_of(after) == TaskResultStatus.SUCCESSFUL, what="the next task")
            # The broken row's first attempt failed on reading it; its retry reads the list it left and runs.
            wait_for(lambda: status_of(broken) == TaskResultStatus.SUCCESSFUL, what="the retry")
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        [error] = broken.errors
        assert error.exception_class_path == "builtins.TypeError"
        assert "errors" in error.traceback
        assert shown in error.traceback
        assert broken.return_value == 42
        assert broken.worker_ids == ["reader", "reader"]


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_a_runner_that_cannot_go_on_stops_the_worker_and_gives_its_claims_back(
    alias: str, concurrency: str
) -> None:
    """A SystemExit from a task_finished receiver ends its runner thread: the worker exits non-zero, holding nothing.

    Before, the runner died silently: the worker lived on, its heartbeat kept renewing the claims no runner would
    ever run, and a ``--burst`` worker never exited. With one task at a time on PostgreSQL (the success recorded
    with the next claim), the receiver's exit code was the worker's, and the task claimed with it stayed RUNNING.
    """
    opts = {"lease": 5, "max_attempts": 1}
    with backend_on(alias, **opts):
        bombs = [jobs.bomb_on_finished.enqueue() for _ in range(2)]
        rest = [jobs.calculate_meaning_of_life.enqueue() for _ in range(4)]
        args = ("--burst", "--concurrency", concurrency, "--worker-id", "fragile")
        with worker_process(alias, *args, options=opts) as worker:
            code, output = worker.wait(timeout=30)
        assert code == 1, output
        assert "fragile" in output
        assert "SystemExit" in output
        assert status_of(bombs[0]) == TaskResultStatus.SUCCESSFUL  # recorded before the receiver
        if concurrency == "2":  # both run at once, each recorded before its receiver
            assert status_of(bombs[1]) == TaskResultStatus.SUCCESSFUL
        every: list[Any] = [*bombs, *rest]
        for result in every:
            row = QueuedTask.objects.using(alias).get(pk=result.id)
            assert row.status in {TaskResultStatus.SUCCESSFUL, TaskResultStatus.READY}, row.status
            if row.status == TaskResultStatus.READY:
                assert row.attempts == 0
                assert row.worker_ids == []
        assert not QueuedTask.objects.using(alias).filter(lease_expires_at__isnull=False).exists()


@pytest.mark.parametrize("concurrency", ["1", "2"])
@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_task_that_leaves_autocommit_off_fails_and_its_write_is_rolled_back(
    alias: str, concurrency: str
) -> None:
    """The task's uncommitted work is rolled back, the attempt fails naming why, the connection serves on.

    Before, the worker wrote the outcome on that connection, in the transaction the task left open: it was never
    committed, the worker took it for a lost commit and gave the task back (run again, or ``WorkerLost``).
    """
    opts = {"lease": 5, "max_attempts": 1}
    with backend_on(alias, **opts):
        leaking = jobs.leave_autocommit_off.enqueue(alias, "leaked")
        after = [jobs.calculate_meaning_of_life.enqueue() for _ in range(4)]
        args = ("--concurrency", concurrency, "--worker-id", "steady")
        with worker_process(alias, *args, options=opts) as worker:
            wait_for(lambda: status_of(leaking) == TaskResultStatus.FAILED, what="the task to fail")
            wait_for(lambda: all(status_of(r) == TaskResultStatus.SUCCESSFUL for r in after), what="the rest")
            assert worker.process.poll() is None
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        leaking.refresh()
        assert [e.exception_class_path for e in leaking.errors] == [
            "lockkit.tasks.errors.TransactionLeftOpen"
        ]
        assert "autocommit" in leaking.errors[0].traceback
        assert leaking.worker_ids == ["steady"]  # one attempt, not given back
        assert not Owner.objects.using(alias).filter(name="leaked").exists()
        assert not QueuedTask.objects.using(alias).filter(lease_expires_at__isnull=False).exists()


@pytest.mark.parametrize("concurrency", ["1", "2"])
@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_task_that_leaves_an_atomic_block_open_stops_its_worker(alias: str, concurrency: str) -> None:
    """The thread's connection can never be used again: the worker exits non-zero at once, not wedged.

    Before, every later claim on that thread failed with "the connection is closed", forever, while the worker
    lived on and its queue waited.
    """
    opts = {"lease": 5, "max_attempts": 1}
    with backend_on(alias, **opts):
        leaking = jobs.leave_atomic_open.enqueue(alias, "leaked")
        args = ("--concurrency", concurrency, "--worker-id", "poisoned")
        with worker_process(alias, *args, options=opts) as worker:
            code, output = worker.wait(timeout=30)
        assert code == 1, output
        assert "TransactionLeftOpen" in output
        assert "atomic()" in output
        assert not Owner.objects.using(alias).filter(name="leaked").exists()
        # The next worker works: the rest run, and the task whose worker stopped ends as WorkerLost.
        after = [jobs.calculate_meaning_of_life.enqueue() for _ in range(3)]
        with worker_process(alias, "--worker-id", "next", options=opts) as worker:
            wait_for(lambda: all(status_of(r) == TaskResultStatus.SUCCESSFUL for r in after), what="the rest")
            wait_for(lambda: status_of(leaking) == TaskResultStatus.FAILED, what="the lost attempt")
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        leaking.refresh()
        assert [e.exception_class_path for e in leaking.errors] == ["lockkit.tasks.errors.WorkerLost"]
        assert not QueuedTask.objects.using(alias).filter(lease_expires_at__isnull=False).exists()


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_a_task_left_in_atomic_does_not_take_the_successes_before_it_down(
    alias: str, concurrency: str
) -> None:
    """Successes buffered for a batch are written on a connection of their own, not inside the task's atomic().

    Before, they were written on the stuck connection, inside the transaction the task left open, and rolled back
    with it when the worker closed it: the tasks ran again (here, ``max_attempts=1``: FAILED with ``WorkerLost``).
    """
    opts = {"lease": 5, "max_attempts": 1}
    with backend_on(alias, **opts):
        before = [jobs.calculate_meaning_of_life.enqueue() for _ in range(2)]
        leaking = jobs.leave_atomic_open.enqueue(alias, "leaked")
        args = ("--burst", "--concurrency", concurrency, "--claim-batch", "4", "--worker-id", "poisoned")
        with worker_process(alias, *args, options=opts) as worker:
            code, output = worker.wait(timeout=30)
        assert code == 1, output
        assert "TransactionLeftOpen" in output
        for result in before:
            result.refresh()
            # Ran once and recorded; or (two runners) never started, given back when the worker stopped.
            done = (result.status, tuple(result.worker_ids))
            assert done in {(TaskResultStatus.SUCCESSFUL, ("poisoned",)), (TaskResultStatus.READY, ())}, (
                output
            )
        assert status_of(before[0]) == TaskResultStatus.SUCCESSFUL  # the first runs before the leaking one
        assert not Owner.objects.using(alias).filter(name="leaked").exists()
        assert status_of(leaking) != TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize(
    "stored",
    ["text", [1, 2], {"args": 5}, {"kwargs": [1]}, {"kwargs": {"1": 1}, "args": "ab"}],
    ids=["str", "list", "args-int", "kwargs-list", "args-str"],
)
@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_row_whose_arguments_are_not_args_and_kwargs_fails_naming_them(alias: str, stored: Any) -> None:
    """A row edited by hand: the attempt fails with a ``TypeError`` naming ``args_kwargs``, as ``get_result`` does.

    Before, an ``AttributeError``/``TypeError`` of the reading code (``'str' object has no attribute 'get'``), and
    the worker logged "a task_finished receiver failed" when no receiver had run.
    """
    opts = {"lease": 5, "max_attempts": 1}
    with backend_on(alias, **opts) as backend, jobs.finished_receiver():
        broken = jobs.echo.enqueue(1)
        QueuedTask.objects.using(alias).filter(pk=broken.id).update(args_kwargs=stored)
        after = jobs.echo.enqueue(2)
        stats = run_worker(backend)
        assert (stats.failed, stats.succeeded) == (1, 1)
        row = QueuedTask.objects.using(alias).get(pk=broken.id)
        [error] = row.errors
        assert error["exception_class_path"] == "builtins.TypeError"
        assert "args_kwargs" in error["traceback"]
        with pytest.raises(TypeError, match="args_kwargs"):
            backend.get_result(broken.id)
        assert backend.get_result(after.id).return_value == {"args": [2], "kwargs": {}}  # the next call works


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_task_s_alarm_timer_and_signal_handlers_end_with_it(alias: str, tmp_path: Path) -> None:
    """One task at a time runs on the main thread: a timer it armed does not fire into what runs next, and a
    ``SIGTERM`` it chose to ignore still stops the worker (before, the task's alarm raised into the worker's loop
    and stopped it, or into the next task; and the worker could no longer be stopped)."""
    opts = {"lease": 5, "max_attempts": 1}
    with backend_on(alias, **opts):
        armed = jobs.arm_alarm_and_ignore_sigterm.enqueue()
        # Runs right after it, for longer than the 0.3 s timer: left armed, the timer would fire inside it.
        after = jobs.slow.enqueue(str(tmp_path / "after"), 1.0)
        with worker_process(alias, "--worker-id", "armed", options=opts) as worker:
            wait_for(lambda: status_of(after) == TaskResultStatus.SUCCESSFUL, what="the next task")
            assert status_of(armed) == TaskResultStatus.SUCCESSFUL
            worker.signal(signal.SIGTERM)
            code, output = worker.wait(timeout=15)
        assert code == 0, output
        assert "TimeoutError" not in output
        assert "a task changed the handler of SIGTERM: put back" in output


@pytest.mark.parametrize("raises", ["exit", "keyboard"])
@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_task_module_that_raises_when_imported_fails_its_task(alias: str, raises: str) -> None:
    """SystemExit or KeyboardInterrupt raised by importing the task's module is the task's error: FAILED at once
    (as any import error: no attempt can succeed), not a worker stopped on every claim of it with its attempts
    climbing past max_attempts (found by a review)."""
    opts = {"lease": 5, "max_attempts": 2}
    with backend_on(alias, **opts):
        poisoned = jobs.calculate_meaning_of_life.enqueue()
        path = "lockkit_tests.tasks.exits_on_import.never_reached"
        QueuedTask.objects.using(alias).filter(pk=poisoned.id).update(task_path=path)
        after = [jobs.calculate_meaning_of_life.enqueue() for _ in range(3)]
        env = {"LOCKKIT_TESTS_IMPORT_RAISES": raises}
        with worker_process(alias, "--worker-id", "importer", options=opts, env=env) as worker:
            wait_for(lambda: all(status_of(r) == TaskResultStatus.SUCCESSFUL for r in after), what="the rest")
            wait_for(lambda: status_of(poisoned) == TaskResultStatus.FAILED, what="the poisoned task to fail")
            assert worker.process.poll() is None  # still working
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        row = QueuedTask.objects.using(alias).get(pk=poisoned.id)
        expected = "builtins.SystemExit" if raises == "exit" else "builtins.KeyboardInterrupt"
        assert [(e["exception_class_path"], e["attempt"]) for e in row.errors] == [(expected, 1)]
        assert row.worker_ids == ["importer"]
        assert row.lease_expires_at is None


_SLOW_OUTCOMES = """
CREATE FUNCTION lockkit_tests_slow_outcome() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM pg_sleep(0.5); RETURN NEW; END $$;
CREATE TRIGGER lockkit_tests_slow_outcome BEFORE UPDATE ON lockkit_tasks_queuedtask FOR EACH ROW
  WHEN (OLD.status = 'RUNNING' AND NEW.status <> 'RUNNING') EXECUTE FUNCTION lockkit_tests_slow_outcome();
"""
_NO_SLOW_OUTCOMES = """
DROP TRIGGER IF EXISTS lockkit_tests_slow_outcome ON lockkit_tasks_queuedtask;
DROP FUNCTION IF EXISTS lockkit_tests_slow_outcome();
"""


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_a_task_s_alarm_timer_is_cancelled_before_its_outcome_is_written(alias: str) -> None:
    """The task arms a 0.1 s timer and fails; writing its failure takes 0.5 s (made to, in the database): the timer
    is cancelled when the task ends, so it does not fire into the write (found by a review: the worker stopped with
    the task's TimeoutError, its outcome unwritten)."""
    opts = {"lease": 5, "max_attempts": 1}
    with connections[alias].cursor() as cursor:
        cursor.execute(_SLOW_OUTCOMES)
    try:
        with backend_on(alias, **opts):
            armed = jobs.arm_alarm_and_fail.enqueue(0.1)
            after = jobs.calculate_meaning_of_life.enqueue()
            with worker_process(alias, "--worker-id", "timed", options=opts) as worker:
                wait_for(lambda: status_of(after) == TaskResultStatus.SUCCESSFUL, what="the next task")
                assert status_of(armed) == TaskResultStatus.FAILED
                worker.signal(signal.SIGTERM)
                code, output = worker.wait(timeout=15)
            assert code == 0, output
            assert [e.exception_class_path for e in armed.errors] == ["builtins.ValueError"]
            assert "TimeoutError" not in output
            assert "a task left an alarm timer armed: cancelled" in output
    finally:
        with connections[alias].cursor() as cursor:
            cursor.execute(_NO_SLOW_OUTCOMES)


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_a_row_whose_json_python_cannot_read_fails_its_task(alias: str) -> None:
    """Valid JSON that Python refuses (5,000 levels deep for Python 3.11 and 3.12, which 3.13 reads: its ``errors``
    are then no list of errors all the same; a 5,000-digit integer), put in a row by hand: read as its text, the task
    fails as any malformed row does; before, reading the claim raised and killed every worker that claimed it, its
    attempts climbing past max_attempts (found by a review)."""
    opts = {"lease": 5, "max_attempts": 2}
    with backend_on(alias, **opts):
        deep = jobs.calculate_meaning_of_life.enqueue()
        huge = jobs.calculate_meaning_of_life.enqueue()
        after = [jobs.calculate_meaning_of_life.enqueue() for _ in range(3)]
        table = QueuedTask._meta.db_table
        with connections[alias].cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET errors = %s::jsonb WHERE id = %s", ["[" * 5000 + "]" * 5000, deep.id]
            )
            cursor.execute(
                f"UPDATE {table} SET args_kwargs = %s::jsonb WHERE id = %s",
                ['{"args": [' + "7" * 5000 + '], "kwargs": {}}', huge.id],
            )
        with worker_process(alias, "--worker-id", "reader", options=opts) as worker:
            wait_for(lambda: all(status_of(r) == TaskResultStatus.SUCCESSFUL for r in after), what="the rest")
            rows = QueuedTask.objects.using(alias).filter(pk__in=[deep.id, huge.id])
            wait_for(lambda: {r.status for r in rows} == {"SUCCESSFUL", "FAILED"}, what="the two rows to end")
            assert worker.process.poll() is None  # still working
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        # Its errors unreadable: the first attempt fails on them (replacing them), the retry runs.
        first = QueuedTask.objects.using(alias).get(pk=deep.id)
        assert first.status == "SUCCESSFUL"
        assert [e["exception_class_path"] for e in first.errors] == ["builtins.TypeError"]
        assert first.worker_ids == ["reader", "reader"]
        # Its arguments unreadable: every attempt fails on them, naming them.
        second = QueuedTask.objects.using(alias).get(pk=huge.id)
        assert second.status == "FAILED"
        assert [e["exception_class_path"] for e in second.errors] == ["builtins.TypeError"] * 2
        assert "args_kwargs" in second.errors[0]["traceback"]
        assert second.lease_expires_at is None


def test_json_python_cannot_read_decodes_as_invalid_json() -> None:
    decoder = arguments.TextIfUnreadable()
    assert decoder.decode('{"a": [1.5]}') == {"a": [1.5]}
    # 50,000 levels: deeper than any supported Python reads (3.13 reads 5,000, 3.11 and 3.12 do not).
    for text in ("[" * 50_000 + "]" * 50_000, "7" * 5000, "{"):
        with pytest.raises(json.JSONDecodeError):
            decoder.decode(text)
