"""``manage.py lockkit_prune_tasks``: finished tasks deleted by age and status, in bounded batches; plus the
database's own check of a task's priority and ``QueuedTask.task_name``.
"""

from __future__ import annotations

import io
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connections, transaction
from django.tasks import TaskResultStatus
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from lockkit.tasks.models import QueuedTask
from lockkit_tests.support.faultkit import extra_alias
from lockkit_tests.tasks.helpers import APPS, backend_on, vendor_aliases

ALL = vendor_aliases()


def _row(alias: str, status: str, days: float | None, *, queue: str = "default", **fields: Any) -> str:
    now = timezone.now()
    row = QueuedTask.objects.using(alias).create(
        backend_name="default",
        queue_name=queue,
        task_path="lockkit_tests.tasks.jobs.noop_task",
        args_kwargs={"args": [], "kwargs": {}},
        enqueued_at=now - timedelta(days=days or 0),
        status=status,
        finished_at=None if days is None else now - timedelta(days=days),
        **fields,
    )
    return str(row.pk)


def _prune(*args: str) -> str:
    out = io.StringIO()
    call_command("lockkit_prune_tasks", *args, stdout=out)
    return out.getvalue()


def _left(alias: str) -> set[str]:
    return {str(pk) for pk in QueuedTask.objects.using(alias).values_list("pk", flat=True)}


@pytest.mark.parametrize("alias", ALL)
def test_prune_deletes_old_finished_tasks_only(alias: str) -> None:
    with backend_on(alias):
        old_ok = _row(alias, TaskResultStatus.SUCCESSFUL, 20)
        old_failed = _row(alias, TaskResultStatus.FAILED, 20)
        young_failed = _row(alias, TaskResultStatus.FAILED, 5)
        other_queue = _row(alias, TaskResultStatus.SUCCESSFUL, 20, queue="queue-1")
        ready = _row(alias, TaskResultStatus.READY, None)
        running = _row(alias, TaskResultStatus.RUNNING, None)
        assert "Would delete 2 task result(s)" in _prune("--dry-run")
        assert len(_left(alias)) == 6
        assert "Deleted 2 task result(s)" in _prune()  # default: 14 days, queue "default", both statuses
        assert _left(alias) == {young_failed, other_queue, ready, running}
        assert "Deleted 1 task result(s)" in _prune("--queue-name", "*", "--failed-min-age-days", "30")
        assert _left(alias) == {young_failed, ready, running}
        assert "Deleted 1 task result(s)" in _prune("--min-age-days", "1", "--status", "FAILED")
        assert _left(alias) == {ready, running}
        assert {old_ok, old_failed}.isdisjoint(_left(alias))


@pytest.mark.parametrize("alias", ALL)
def test_prune_works_in_bounded_batches(alias: str) -> None:
    with backend_on(alias):
        old = [_row(alias, TaskResultStatus.SUCCESSFUL, 30 - n) for n in range(5)]  # oldest first
        with CaptureQueriesContext(connections[alias]) as queries:
            assert "Deleted 3 task result(s)" in _prune("--batch-size", "2", "--max-rows", "3")
        deletes = [q["sql"] for q in queries.captured_queries if q["sql"].upper().startswith("DELETE")]
        assert len(deletes) == 2  # 2 + 1 rows
        assert _left(alias) == set(old[3:])  # the oldest went first
        assert "Deleted 2 task result(s)" in _prune("--batch-size", "1")
        assert _left(alias) == set()


@pytest.mark.parametrize(
    "args",
    [
        ["--min-age-days", "-1"],
        ["--min-age-days", "x"],
        ["--failed-min-age-days", "nan"],
        ["--min-age-days", "1e9"],  # past timedelta's range
        ["--failed-min-age-days", "800000"],  # before year 1
        ["--batch-size", "0"],
        ["--batch-size", "100001"],
        ["--max-rows", "0"],
        ["--status", "RUNNING"],
        ["--backend", "nope"],
        ["--queue-name", ""],  # a hostile review: warned and ran, where lockkit_worker refuses it
        ["--queue-name", "default,"],
    ],
)
def test_prune_refuses_bad_options(args: list[str]) -> None:
    with pytest.raises(CommandError, match=f"{args[0]}"):
        _prune(*args)


@pytest.mark.parametrize("alias", ALL)
@pytest.mark.parametrize("priority", [101, -101, 32000])
def test_the_database_refuses_a_priority_out_of_range(alias: str, priority: int) -> None:
    with backend_on(alias):
        with pytest.raises(IntegrityError), transaction.atomic(using=alias):
            _row(alias, TaskResultStatus.READY, None, priority=priority)
        _row(alias, TaskResultStatus.READY, None, priority=100)
        _row(alias, TaskResultStatus.READY, None, priority=-100)
        assert QueuedTask.objects.using(alias).count() == 2


def test_task_name_is_read_from_the_path_without_importing() -> None:
    row = QueuedTask(task_path="lockkit_tests.tasks.jobs.echo")
    assert row.task_name == "echo"
    assert QueuedTask(task_path="gone.module.send_receipt").task_name == "send_receipt"


@pytest.mark.parametrize("alias", ALL[:1])
def test_a_queue_name_the_backend_does_not_have_is_reported(alias: str) -> None:
    with backend_on(alias):
        kept = _row(alias, TaskResultStatus.SUCCESSFUL, 20, queue="queue-1")
        err = io.StringIO()
        call_command("lockkit_prune_tasks", "--queue-name", "queue1", stdout=io.StringIO(), stderr=err)
        assert err.getvalue().strip() == "--queue-name: 'queue1' not a queue of backend 'default'"
        assert _left(alias) == {kept}


@pytest.mark.django_db(transaction=True, available_apps=APPS)
def test_prune_reads_the_oldest_finished_by_an_index() -> None:
    """A hostile review: every batch read and sorted the whole table (29 s for 300,000 rows); now an index scan."""
    with backend_on("default"), connections["default"].cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")  # the plan an index allows, whatever the table's size now
        try:
            queryset = QueuedTask.objects.using("default").filter(finished_at__lte=timezone.now())
            plan = queryset.order_by("finished_at", "pk").values("pk")[:1000].explain()
        finally:
            cursor.execute("RESET enable_seqscan")
    assert "lockkit_tasks_finished_idx" in plan, plan


def _zone_away_from(alias: str) -> str:
    """A time zone whose offset now differs from the database session's clock by hours."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(), NOW())")
        (offset,) = cursor.fetchone()
    return "Asia/Tokyo" if abs(offset - 540) > 60 else "America/New_York"


@pytest.mark.parametrize("alias", [a for a in vendor_aliases() if a.values[0] == "mariadb"])
def test_with_use_tz_false_a_database_clock_in_another_zone_stops_the_commands_before_they_act(
    alias: str,
) -> None:
    # Found by a review: Django writes naive TIME_ZONE times, MariaDB's NOW() reads the server's zone: prune took
    # a task that had just finished for hours old and deleted it, and scheduled tasks waited hours.
    zone = _zone_away_from(alias)
    with override_settings(USE_TZ=False, TIME_ZONE=zone), backend_on(alias):
        just_finished = _row(alias, TaskResultStatus.SUCCESSFUL, 0)
        for command in (["lockkit_prune_tasks", "--min-age-days", "0.25"], ["lockkit_worker", "--burst"]):
            with pytest.raises(CommandError, match=f"USE_TZ = False: .* naive {zone} time"):
                call_command(*command, stdout=io.StringIO(), stderr=io.StringIO())
        assert _left(alias) == {just_finished}
    # The clocks agree (a zone with the session's offset now): the commands run, the task just finished is kept.
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(), NOW())")
        (offset,) = cursor.fetchone()
    hours = round(offset / 60)
    same = "UTC" if hours == 0 else f"Etc/GMT{-hours:+d}"  # Etc/GMT-9 is nine hours ahead of UTC
    with override_settings(USE_TZ=False, TIME_ZONE=same), backend_on(alias):
        QueuedTask.objects.using(alias).update(finished_at=timezone.now())
        assert "Deleted 0 task result(s)" in _prune("--min-age-days", "0.25")
        assert _left(alias) == {just_finished}


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then closed): a server that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"], available_apps=APPS)
@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            lambda: {"HOST": "127.0.0.1", "PORT": _closed_port()},
            "lockkit_prune_tasks: database 'proxied' could not be asked: ",
        ),
        (
            lambda: {"NAME": "lockkit_no_such_database"},
            "lockkit_prune_tasks: the server refused the settings of database alias 'proxied' (NAME "
            "'lockkit_no_such_database'",
        ),
        (
            lambda: {"NAME": "postgres"},  # a database with no task table: migrate not run
            "the table lockkit_tasks_queuedtask of lockkit.tasks does not exist on database 'proxied': run "
            "`manage.py migrate --database proxied` first",
        ),
    ],
    ids=["down", "no-such-database", "not-migrated"],
)
def test_a_database_it_cannot_use_stops_it_in_one_line(
    overrides: Callable[[], dict[str, Any]], says: str
) -> None:
    # A new user's trial: each of these was a raw OperationalError/ProgrammingError traceback, where lockkit_worker
    # says each in one line.
    with extra_alias("proxied", "default", **overrides()), backend_on("proxied"):
        with pytest.raises(CommandError) as stopped:
            _prune("--dry-run")
    assert str(stopped.value).startswith(says)
    assert "\n" not in str(stopped.value)
