"""``manage.py lockkit_worker``'s options shared with django-tasks' ``db_worker``, as real worker processes.

``--max-tasks N``, ``--batch`` (run what is ready, then exit), queue exclusion, ``--claim-batch N`` (the claim size
that ``--batch N`` used to set: a unit file still saying ``--batch 16`` is refused, never silently reinterpreted),
and the startup line on stderr.
"""

from __future__ import annotations

import re
import signal
import threading
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connections, transaction
from django.tasks import TaskResultStatus
from django.test import override_settings
from django.utils import timezone

from lockkit.tasks.models import QueuedTask
from lockkit.tasks.notify import Wakeup
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import (
    APPS,
    backend_on,
    rows,
    status_of,
    tasks_setting,
    vendor_aliases,
    wait_for,
    worker_process,
)

ALL = vendor_aliases(apps=APPS)
POSTGRESQL, MARIADB, SQLITE = ALL


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_max_tasks_exits_after_that_many(alias: str) -> None:
    """Not a burst worker: it exits 0 after N tasks, and claims no more than N (none left claimed)."""
    with backend_on(alias):
        results = [jobs.calculate_meaning_of_life.enqueue() for _ in range(5)]
        args = ("--max-tasks", "3", "--claim-batch", "4", "--worker-id", "short")
        with worker_process(alias, *args) as worker:
            code, output = worker.wait(timeout=30)
        assert code == 0, output
        # The start line; it said "at most 1 tasks" for --max-tasks 1.
        assert "; at most 3 task(s);" in output
        assert "worker short: 3 succeeded, 0 failed" in output
        assert [status_of(r) for r in results] == [TaskResultStatus.SUCCESSFUL] * 3 + [
            TaskResultStatus.READY
        ] * 2
        assert not QueuedTask.objects.using(alias).filter(worker_log__gt="").filter(status="READY").exists()


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_batch_runs_what_is_ready_then_exits_and_queues_can_be_excluded(alias: str) -> None:
    with backend_on(alias):
        mine = jobs.calculate_meaning_of_life.enqueue()
        other = jobs.calculate_meaning_of_life.using(queue_name="queue-1").enqueue()
        args = ("--batch", "--queue-name", "*", "--exclude-queues", "queue-1", "--worker-id", "flag")
        with worker_process(alias, *args) as worker:
            code, output = worker.wait(timeout=30)
        assert code == 0, output
        assert (status_of(mine), status_of(other)) == (TaskResultStatus.SUCCESSFUL, TaskResultStatus.READY)


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_no_queue_named_takes_the_default_queue_only_as_db_worker(alias: str) -> None:
    """A db_worker unit file keeps its meaning: no ``--queue-name`` is the ``"default"`` queue; ``'*'`` is every queue.

    Options passed as strings to ``call_command`` (as db_worker's) are read whole, not letter by letter.
    """
    with override_settings(TASKS=tasks_setting(alias)):
        mine = jobs.noop_task.enqueue()
        other = jobs.noop_task.using(queue_name="queue-1").enqueue()
        err = StringIO()
        call_command("lockkit_worker", "--batch", stdout=StringIO(), stderr=err)
        assert (status_of(mine), status_of(other)) == (TaskResultStatus.SUCCESSFUL, TaskResultStatus.READY)
        assert "queues default;" in err.getvalue()
        assert "not taking queue(s) queue-1 (--queue-name '*' for all)" in err.getvalue()
        call_command(
            "lockkit_worker", batch=True, queue_name="*", exclude_queues="queue-1", stdout=StringIO()
        )
        assert status_of(other) == TaskResultStatus.READY
        err = StringIO()
        call_command("lockkit_worker", batch=True, queues="queue-1", stdout=StringIO(), stderr=err)
        assert status_of(other) == TaskResultStatus.SUCCESSFUL
        assert "is not a queue" not in err.getvalue()


@pytest.mark.parametrize("alias", [POSTGRESQL])
@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("exclude_queues", 5, "--exclude-queues"),
        ("exclude_queues", ["queue-1", 2], "--exclude-queues"),
        ("queues", 3, "--queue"),
        ("queue_name", 7, "--queue-name"),
    ],
)
def test_a_queue_option_of_another_type_from_call_command_is_a_command_error(
    alias: str, option: str, value: Any, named: str
) -> None:
    """``call_command`` passes values as given: a non-string queue option is refused naming it, nothing claimed."""
    with override_settings(TASKS=tasks_setting(alias)):
        waiting = jobs.noop_task.enqueue()
        with pytest.raises(CommandError, match=f"^{re.escape(named)} takes queue names"):
            call_command("lockkit_worker", "--batch", stdout=StringIO(), stderr=StringIO(), **{option: value})
        assert status_of(waiting) == TaskResultStatus.READY


@pytest.mark.parametrize("alias", [POSTGRESQL])
@pytest.mark.parametrize(
    ("command", "options", "message"),
    [
        ("lockkit_worker", {"worker_id": 5}, "--worker-id: worker_id must be a string, got int"),
        ("lockkit_worker", {"worker_id": "a\x00b"}, "--worker-id: worker_id must be 1 to 255 characters"),
        ("lockkit_prune_tasks", {"queue_name": 5}, "--queue-name takes queue names (a string), got 5"),
        ("lockkit_prune_tasks", {"queue_name": ["default"]}, "--queue-name takes queue names (a string)"),
        ("lockkit_prune_tasks", {"status": ["bogus"]}, "--status takes SUCCESSFUL or FAILED, got ['bogus']"),
        ("lockkit_prune_tasks", {"status": 3}, "--status takes SUCCESSFUL or FAILED, got 3"),
    ],
)
def test_options_of_another_type_from_call_command_are_command_errors_naming_them(
    alias: str, command: str, options: dict[str, Any], message: str
) -> None:
    with override_settings(TASKS=tasks_setting(alias)):
        waiting = jobs.noop_task.enqueue()
        with pytest.raises(CommandError, match=f"^{re.escape(message)}"):
            call_command(command, "--burst" if command == "lockkit_worker" else "--dry-run", stdout=StringIO(),
                         stderr=StringIO(), **options)  # fmt: skip
        assert status_of(waiting) == TaskResultStatus.READY


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_prune_status_given_as_one_string_from_call_command_is_that_status(alias: str) -> None:
    """``call_command("lockkit_prune_tasks", status="FAILED")``: the status, not its letters (a ValueError before)."""
    with override_settings(TASKS=tasks_setting(alias)):
        ended = {"finished_at": timezone.now() - timedelta(days=1), "lease_expires_at": None}
        for status in (TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL, TaskResultStatus.SUCCESSFUL):
            done = jobs.noop_task.enqueue()
            QueuedTask.objects.using(alias).filter(pk=done.id).update(status=status, **ended)
        out = StringIO()
        call_command("lockkit_prune_tasks", status="FAILED", min_age_days=0, dry_run=True, stdout=out)
        assert out.getvalue() == "Would delete 1 task result(s)\n"


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
@pytest.mark.parametrize("inside", ["its database", "default"])
def test_a_worker_started_inside_atomic_is_refused_before_it_claims(alias: str, inside: str) -> None:
    """As in a ``TestCase`` (or ``django_db`` without ``transaction=True``): a clear refusal, the task left READY.

    Before, the worker claimed and ran the task inside the test's transaction, then stopped blaming the task
    (``TransactionLeftOpen``) and reported claims "given back" that it could not give back.
    """
    with override_settings(TASKS=tasks_setting(alias)):
        waiting = jobs.noop_task.enqueue()
        with transaction.atomic(using=alias if inside == "its database" else inside):
            with pytest.raises(
                CommandError, match=r"^a worker cannot run inside a transaction \(atomic\(\) is "
            ):
                call_command("lockkit_worker", "--burst", stdout=StringIO(), stderr=StringIO())
        assert status_of(waiting) == TaskResultStatus.READY
        assert waiting.worker_ids == []  # never claimed


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_no_queue_named_on_a_backend_without_a_default_queue_is_refused(alias: str) -> None:
    setting = tasks_setting(alias)
    setting["default"]["QUEUES"] = ["queue-1"]
    with override_settings(TASKS=setting):
        message = "backend 'default' has no queue 'default' (its QUEUES: queue-1): name the queues to take"
        with pytest.raises(CommandError, match=re.escape(message)):
            call_command("lockkit_worker", "--batch", stdout=StringIO(), stderr=StringIO())
        call_command("lockkit_worker", "--batch", "--queue-name", "*", stdout=StringIO(), stderr=StringIO())


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_batch_with_a_number_is_refused_naming_claim_batch(alias: str) -> None:
    """``--batch 16`` from a unit file written for the old meaning: exit 1 with the new name, nothing claimed."""
    with backend_on(alias):
        waiting = jobs.calculate_meaning_of_life.enqueue()
        with worker_process(alias, "--batch", "16", "--concurrency", "4") as worker:
            code, output = worker.wait(timeout=30)
        assert code == 1, output
        assert "--claim-batch 16" in output
        assert status_of(waiting) == TaskResultStatus.READY


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_startup_line_on_stderr_without_logging(alias: str) -> None:
    with backend_on(alias):
        args = ("--batch", "--concurrency", "2", "--queue", "default", "--worker-id", "announced")
        with worker_process(alias, *args, env={"LOCKKIT_TASKS_TEST_NO_LOGGING": "1"}) as worker:
            code, output = worker.wait(timeout=30)
        assert code == 0, output
        assert (
            "lockkit_worker announced: queues default; concurrency 2; claim batch 2; lease 5s; idle poll 0.1s; "
            "backend 'default' on database 'default'" in output
        )
        assert (
            "of backend 'default' on database" not in output
        )  # the INFO log line: logging is not configured


@pytest.mark.parametrize("alias", [POSTGRESQL])
@pytest.mark.parametrize(
    ("argv", "kwargs", "message"),
    [
        (["--batch", "4"], {}, "--batch N is now --claim-batch N"),
        ([], {"batch": 4}, "--batch N is now --claim-batch N"),
        (
            ["--queue-name", "default,queue-1", "--exclude-queues", "queue-1"],
            {},
            "--exclude-queues can only be used with --queue-name=*",
        ),
        (["--exclude-queues", "queue-1"], {}, "--exclude-queues can only be used with --queue-name=*"),
        ([], {"queue_name": "*", "exclude_queues": "default,queue-1"}, "no queue left"),
        (
            ["--queue-name", "*", "--exclude-queues", "default", "--exclude-queues", "queue-1"],
            {},
            "no queue left",
        ),
        (["--queue-name", "*", "--exclude-queues", "default,queue-1"], {}, "no queue left"),
        (["--queue-name", "nope"], {}, "--queue/--queue-name: queues must name queues of backend 'default'"),
        (["--queue-name", ""], {}, "--queue-name: no queue named in '' ('*' for all)"),
        (["--queue-name", ",,"], {}, "--queue-name: no queue named in ',,' ('*' for all)"),
        (["--max-tasks", "0"], {}, "--max-tasks must be a whole number from 1 to"),
        (["--claim-batch", "1001"], {}, "--claim-batch must be a whole number from 1 to 1000, got '1001'"),
        (["--interval", "0"], {}, "--interval must be a number from 0.01 to 86400, got '0'"),
        (["--interval", "nan"], {}, "--interval must be a number from 0.01 to 86400, got 'nan'"),
        (["--reload"], {}, "lockkit_worker has no --reload"),
    ],
)
def test_options_refused_before_sql(
    alias: str, argv: list[str], kwargs: dict[str, object], message: str
) -> None:
    with override_settings(TASKS=tasks_setting(alias)):
        jobs.noop_task.enqueue()
        with pytest.raises(CommandError, match=re.escape(message)):
            call_command("lockkit_worker", *argv, stdout=StringIO(), stderr=StringIO(), **kwargs)
        assert [row.status for row in rows(alias)] == [TaskResultStatus.READY]


@pytest.mark.parametrize("alias", [MARIADB])
def test_interval_sets_the_idle_poll_and_db_workers_no_op_options_are_accepted(alias: str) -> None:
    """A task that becomes due while the worker is idle is found by its next poll: every ``--interval``.

    On MariaDB nothing else wakes an idle worker (no ``NOTIFY``), and with the backend's ``poll_interval`` of 60 s
    the task would wait past the test's 30 s.
    """
    with backend_on(alias, poll_interval=60):
        due = timezone.now() + timedelta(seconds=2)
        result = jobs.calculate_meaning_of_life.using(run_after=due).enqueue()
        args = ("--interval", "0.05", "--no-startup-delay", "--no-reload", "--worker-id", "polling")
        with worker_process(alias, *args, options={"poll_interval": 60}) as worker:
            wait_for(
                lambda: status_of(result) == TaskResultStatus.SUCCESSFUL, what="the task to run", timeout=30
            )
            worker.signal(signal.SIGTERM)
            code, output = worker.wait(timeout=30)
        assert code == 0, output
        assert "idle poll 0.05s" in output
        assert "worker polling: 1 succeeded" in output


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_queue_name_takes_db_workers_comma_list_and_star(alias: str) -> None:
    with override_settings(TASKS=tasks_setting(alias)):
        first = jobs.noop_task.using(queue_name="queue-1").enqueue()
        other = jobs.noop_task.enqueue()
        call_command(
            "lockkit_worker", "--batch", "--queue-name", "queue-1,", stdout=StringIO(), stderr=StringIO()
        )
        assert (status_of(first), status_of(other)) == (TaskResultStatus.SUCCESSFUL, TaskResultStatus.READY)
        err = StringIO()
        call_command("lockkit_worker", "--batch", "--queue-name", "*", stdout=StringIO(), stderr=err)
        assert status_of(other) == TaskResultStatus.SUCCESSFUL
        assert "queues default, queue-1;" in err.getvalue()


@pytest.mark.timeout(60)  # before the fix the command retried for ever
@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_database_not_migrated_stops_the_worker_at_start_naming_migrate(alias: str) -> None:
    """A missing task table is a setup error, not an outage to ride out: before, the worker (``--burst`` too) retried
    "relation does not exist" for ever and never said to migrate (a new user's trial)."""
    table = QueuedTask._meta.db_table
    with backend_on(alias):
        with connections[alias].schema_editor() as editor:
            editor.alter_db_table(QueuedTask, table, f"{table}_away")
        try:
            with pytest.raises(CommandError) as raised:
                call_command("lockkit_worker", "--burst", stdout=StringIO(), stderr=StringIO())
            # enqueue() raises the database's own error, with a note naming the command to run.
            with pytest.raises(DatabaseError) as enqueued:
                jobs.calculate_meaning_of_life.enqueue()
            assert enqueued.value.__notes__ == [
                f"lockkit.tasks: the task table {table} does not exist on database {alias!r}: "
                f"run `manage.py migrate --database {alias}`"
            ]
        finally:
            with connections[alias].schema_editor() as editor:
                editor.alter_db_table(QueuedTask, f"{table}_away", table)
        assert str(raised.value) == (
            f"the table(s) {table} of lockkit.tasks do not exist on database {alias!r}: "
            f"run `manage.py migrate --database {alias}` first"
        )
        # Migrated again, the same command runs what is ready.
        waiting = jobs.calculate_meaning_of_life.enqueue()
        call_command("lockkit_worker", "--burst", stdout=StringIO(), stderr=StringIO())
        assert status_of(waiting) == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("alias", ALL)
def test_every_queue_on_a_backend_that_allows_any_queue_name(alias: str) -> None:
    """``QUEUES: []`` (Django: any queue name): ``--queue-name '*'`` takes tasks of every queue, less those excluded.

    Before, the command exited 1: "queues must name queues of backend 'default' (); got none".
    """
    setting = tasks_setting(alias)
    setting["default"]["QUEUES"] = []
    with override_settings(TASKS=setting):
        kept = [jobs.noop_task.using(queue_name=name).enqueue() for name in ("default", "emails", "q" * 32)]
        excluded = jobs.noop_task.using(queue_name="reports").enqueue()
        err = StringIO()
        call_command(
            "lockkit_worker", "--batch", "--queue-name", "*", "--exclude-queues", "reports,nothing",
            stdout=StringIO(), stderr=err,
        )  # fmt: skip
        assert [status_of(r) for r in kept] == [TaskResultStatus.SUCCESSFUL] * 3, err.getvalue()
        assert status_of(excluded) == TaskResultStatus.READY
        assert excluded.worker_ids == []  # never claimed
        assert "queues every queue but nothing, reports;" in err.getvalue()
        assert "is not a queue" not in err.getvalue()  # any name is one
        out = StringIO()
        call_command("lockkit_worker", batch=True, queue_name="*", stdout=out, stderr=StringIO())
        assert status_of(excluded) == TaskResultStatus.SUCCESSFUL
        assert "1 succeeded" in out.getvalue()


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_a_worker_of_any_queue_is_woken_by_every_queue_but_the_excluded(alias: str) -> None:
    """Its ``LISTEN`` thread wakes it for a task of any queue name, not for one of a queue it excludes."""
    setting = tasks_setting(alias)
    setting["default"]["QUEUES"] = []
    with override_settings(TASKS=setting):
        wake = threading.Event()
        wakeup = Wakeup(alias, None, wake, excluded=["reports"])
        wakeup.start()
        try:
            wait_for(wakeup.listening.is_set, what="LISTEN")
            wait_for(wake.is_set, what="the wake after LISTEN")
            wake.clear()
            jobs.noop_task.using(queue_name="reports").enqueue()
            assert not wake.wait(0.5)  # excluded: not woken
            jobs.noop_task.using(queue_name="emails").enqueue()
            assert wake.wait(5)
        finally:
            wakeup.stop()
