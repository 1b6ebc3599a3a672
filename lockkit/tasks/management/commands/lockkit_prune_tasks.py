"""``manage.py lockkit_prune_tasks``: delete finished tasks older than an age, in bounded batches."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from django.db.models import Q
from django.tasks import DEFAULT_TASK_QUEUE_NAME
from django.tasks.base import TaskResultStatus
from django.utils import timezone

from lockkit.tasks.clock import naive_clock_mismatch
from lockkit.tasks.management.backends import lockkit_backend
from lockkit.tasks.management.database import tables_present
from lockkit.tasks.models import QueuedTask

#: The finished statuses, the only ones pruned.
FINISHED = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
#: The largest ``--batch-size``: one statement never deletes more rows than this.
MAX_BATCH = 100_000
#: The largest age in days (1000 years): an older cut-off would fall before the dates Python and the databases hold.
MAX_DAYS = 365_000


def _days(name: str, value: object) -> float:
    """``value`` of ``--name`` as a number of days, 0 to ``MAX_DAYS``; else ``CommandError`` naming the option."""
    allowed = f"--{name} must be a number of days from 0 to {MAX_DAYS}, got {value!r}"
    try:
        days = float(str(value))
    except ValueError:
        raise CommandError(allowed) from None
    if not math.isfinite(days) or not 0 <= days <= MAX_DAYS:
        raise CommandError(allowed)
    return days


def _table_ready(alias: str) -> None:
    """Stop with one line when the task table's database cannot be asked, or has no task table (not migrated).

    From cron, a raw ``OperationalError`` traceback hid the cause in its last lines (a new user's trial: a server
    down, a ``NAME`` it does not have, ``migrate`` not run), where ``lockkit_worker`` says each in one line.

    Raises:
        CommandError: the database could not be asked (the server's message, on one line), or the server refused
            the alias's settings, or the task table does not exist there; nothing was deleted.
    """
    try:
        present = tables_present(alias, "lockkit_prune_tasks", "; nothing deleted")
    except DatabaseError as failure:
        server = " ".join(str(failure).split())  # libpq's message spans lines
        raise CommandError(
            f"lockkit_prune_tasks: database {alias!r} could not be asked: {server}; nothing deleted"
        ) from failure
    table = QueuedTask._meta.db_table
    if table.lower() not in present:
        raise CommandError(
            f"the table {table} of lockkit.tasks does not exist on database {alias!r}: run `manage.py migrate "
            f"--database {alias}` first"
        )


def _count(name: str, value: object, high: int | None) -> int:
    """``value`` of ``--name`` as a whole number from 1 to ``high``; else ``CommandError`` naming the option."""
    allowed = f"--{name} must be a whole number from 1" + (f" to {high}" if high else "")
    try:
        number = int(str(value))
    except ValueError:
        raise CommandError(f"{allowed}, got {value!r}") from None
    if number < 1 or (high is not None and number > high):
        raise CommandError(f"{allowed}, got {value!r}")
    return number


class Command(BaseCommand):
    """``manage.py lockkit_prune_tasks``: delete finished tasks by age and status, in bounded batches.

    Options: ``--backend``, ``--queue-name``, ``--min-age-days``, ``--failed-min-age-days``, ``--status``,
    ``--batch-size``, ``--max-rows``, ``--dry-run``. The names of the options it shares with django-tasks' ``prune_db_task_results`` are the same, with the same
    defaults. Only ``SUCCESSFUL`` and ``FAILED`` tasks are deleted, by ``finished_at``; waiting and running ones
    never. Each batch is one short ``DELETE`` of at most ``--batch-size`` rows (oldest first) in its own
    transaction, so workers claiming and finishing tasks are never blocked for long. See docs/tasks.md.
    """

    # The system checks run in handle(), on no database, as lockkit_worker's: Django 6.1 checks every alias's
    # fields by default, and MariaDB's field checks ask the server, so a server down stopped the command with a
    # raw OperationalError traceback before _table_ready() could say so in one line.
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django's own attribute

    help = "Delete finished tasks (SUCCESSFUL/FAILED) of a lockkit.tasks.DatabaseBackend older than an age."

    def add_arguments(self, parser: CommandParser) -> None:
        """The options."""
        parser.add_argument(
            "--backend", default="default", help="The alias in settings.TASKS (default: default)."
        )
        parser.add_argument(
            "--queue-name",
            default=DEFAULT_TASK_QUEUE_NAME,
            help="The queues to prune, separated by commas; '*' for every queue (default: default).",
        )
        parser.add_argument(
            "--min-age-days",
            default=14,
            help="Days since a task finished before it is deleted (default: 14).",
        )
        parser.add_argument(
            "--failed-min-age-days",
            default=None,
            help="Days since a FAILED task finished before it is deleted (default: --min-age-days).",
        )
        parser.add_argument(
            "--status",
            action="append",
            choices=[str(status) for status in FINISHED],
            help="Delete only tasks of this status (repeatable; default: both).",
        )
        parser.add_argument(
            "--batch-size", default=1000, help=f"Rows deleted per statement (1 to {MAX_BATCH}; default 1000)."
        )
        parser.add_argument(
            "--max-rows", default=None, help="Rows deleted at most in this run (default: all)."
        )
        parser.add_argument("--dry-run", action="store_true", help="Count the tasks that would be deleted.")

    def handle(self, *args: Any, **options: Any) -> None:
        """Delete (or count) the tasks.

        Raises:
            CommandError: an unknown backend, a backend that is not lockkit's, or a bad option (named), before
                any SQL.
            CommandError: the database cannot be asked, refuses the alias's settings or has no task table
                (``migrate`` not run), in one line, nothing deleted.
            CommandError: with ``USE_TZ = False`` on MariaDB/MySQL, the database clock is not ``TIME_ZONE``'s
                (nothing deleted; ``lockkit.tasks.clock``).
        """
        if not options.get("skip_checks"):  # called as call_command(): absent unless given
            self.check(databases=[])
        min_age = _days("min-age-days", options["min_age_days"])
        failed = options["failed_min_age_days"]
        failed_age = min_age if failed is None else _days("failed-min-age-days", failed)
        batch = _count("batch-size", options["batch_size"], MAX_BATCH)
        limit = None if options["max_rows"] is None else _count("max-rows", options["max_rows"], None)
        given = options["status"]
        if isinstance(given, str):  # call_command(status="FAILED"): one status, not its letters
            given = [given]
        if given is not None and (
            not isinstance(given, list | tuple) or any(str(item) not in map(str, FINISHED) for item in given)
        ):
            raise CommandError(f"--status takes {' or '.join(map(str, FINISHED))}, got {given!r}")
        statuses = {str(item) for item in given or FINISHED}
        backend = lockkit_backend(options["backend"])
        now = timezone.now()
        ages = {
            TaskResultStatus.SUCCESSFUL: now - timedelta(days=min_age),
            TaskResultStatus.FAILED: now - timedelta(days=failed_age),
        }
        due = Q()
        for status in statuses:
            due |= Q(status=status, finished_at__lte=ages[TaskResultStatus(status)])
        alias = backend.database()
        tasks = QueuedTask.objects.using(alias).filter(
            due, backend_name=backend.alias, lease_expires_at__isnull=True
        )
        if not isinstance(options["queue_name"], str):
            raise CommandError(f"--queue-name takes queue names (a string), got {options['queue_name']!r}")
        queues = options["queue_name"].split(",")
        if "" in queues:  # as lockkit_worker: a list that names no queue is a mistake, not "no filter"
            raise CommandError(f"--queue-name: {options['queue_name']!r} names no queue (use * for all)")
        if "*" not in queues:
            tasks = tasks.filter(queue_name__in=queues)
            unknown = sorted(set(queues) - backend.queues) if backend.queues else []
            if unknown:  # a typo would otherwise look like a run that found nothing to delete
                self.stderr.write(
                    f"--queue-name: {', '.join(map(repr, unknown))} not a queue of backend {backend.alias!r}"
                )
        _table_ready(alias)  # after every option is checked: it asks the database
        mismatch = naive_clock_mismatch(alias)
        if mismatch:
            raise CommandError(mismatch)
        if options["dry_run"]:
            count = tasks.count() if limit is None else min(limit, tasks.count())
            self.stdout.write(f"Would delete {count} task result(s)")
            return
        deleted = 0
        while limit is None or deleted < limit:
            size = batch if limit is None else min(batch, limit - deleted)
            pks = list(tasks.order_by("finished_at", "pk").values_list("pk", flat=True)[:size])
            if not pks:
                break
            # The filter again: a row that changed since it was read is left (and not read again).
            count, _ = tasks.filter(pk__in=pks).delete()
            deleted += count
        self.stdout.write(f"Deleted {deleted} task result(s)")
