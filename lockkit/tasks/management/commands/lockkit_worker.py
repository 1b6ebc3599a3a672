"""``manage.py lockkit_worker``: run the tasks of a ``lockkit.tasks.DatabaseBackend`` until stopped."""

from __future__ import annotations

import argparse
import math
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.db.transaction import TransactionManagementError
from django.tasks import DEFAULT_TASK_QUEUE_NAME

from lockkit.errorcodes.translate import translate
from lockkit.errors import ConnectionLost, DatabaseMisconfigured
from lockkit.tasks.backend import DatabaseBackend
from lockkit.tasks.clock import naive_clock_mismatch
from lockkit.tasks.management.backends import lockkit_backend
from lockkit.tasks.management.database import refused_settings, tables_present
from lockkit.tasks.models import QueuedTask
from lockkit.tasks.periodic.models import PeriodicSchedule
from lockkit.tasks.stopping import STOP_SIGNALS
from lockkit.tasks.worker import Worker

#: The allowed range of each numeric option: (lowest, highest, whether a fraction is allowed). See docs/tasks.md.
BOUNDS: dict[str, tuple[float, float, bool]] = {
    "concurrency": (1, 256, False),
    "claim-batch": (1, 1000, False),
    "lease": (1, 86400, True),
    "max-tasks": (1, 2**31 - 1, False),
    "interval": (0.01, 86400, True),
}


def bounded(name: str, value: object) -> int | float:
    """``value`` of option ``--name`` as a number within its ``BOUNDS``.

    Args:
        name: The option's name without its leading dashes (a key of ``BOUNDS``).
        value: What was given: a string from the command line, or a number from ``call_command``.

    Returns:
        The number (an ``int`` unless the option allows fractions).

    Raises:
        CommandError: ``value`` is not a number, not a whole number where one is required, or out of range; the
            message names the option and its range.
    """
    low, high, fraction = BOUNDS[name]
    kind = "a number" if fraction else "a whole number"
    allowed = f"--{name} must be {kind} from {low} to {high}"
    number: int | float
    try:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(value)
        if not fraction and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        number = float(value) if fraction else int(value)
    except (TypeError, ValueError):
        raise CommandError(f"{allowed}, got {value!r}") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise CommandError(f"{allowed}, got {value!r}")
    return number


class Command(BaseCommand):
    """``manage.py lockkit_worker``: claim, run and record the tasks of a ``lockkit.tasks.DatabaseBackend``.

    ``[--backend B] [--queue Q ...] [--queue-name Q,R|*] [--exclude-queues Q,R ...] [--burst | --batch]
    [--max-tasks N] [--concurrency N] [--claim-batch N] [--lease S] [--interval S] [--worker-id NAME]``; the
    options it shares with django-tasks' ``db_worker`` (``--backend``, ``--queue-name``, ``--batch``,
    ``--max-tasks``, ``--interval``, ``--worker-id``) mean what they mean there; its ``--no-startup-delay`` and
    ``--no-reload`` are accepted and change nothing, its ``--reload`` is refused. ``SIGTERM`` or ``SIGINT`` (Ctrl-C): the claimed tasks not started
    are given back at once, the running tasks finish, and the command exits 0. A second signal stops at once
    (exit 1); the tasks it was running are taken again by another worker when their lease ends. See docs/tasks.md.
    """

    # The system checks run in handle(), on no database: Django 6.1 checks every alias's fields by default, which
    # connects (MariaDB's field checks ask the server), so a server down at start stopped the worker with a raw
    # OperationalError instead of being waited out as any later outage is. ``manage.py check`` still runs them.
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django's own attribute

    help = (
        "Run the tasks of a lockkit.tasks.DatabaseBackend: claim ready tasks (SKIP LOCKED, leases, fencing "
        "tokens), run them, record their results; retry failures with backoff up to max_attempts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        """The options."""
        parser.add_argument("--skip-checks", action="store_true", help="Skip system checks.")
        parser.add_argument(
            "--backend", default="default", help="The alias in settings.TASKS (default: default)."
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="QUEUE",
            help="A queue to take tasks from (repeatable; default: the 'default' queue, as db_worker).",
        )
        parser.add_argument(
            "--queue-name",
            default=None,
            metavar="QUEUES",
            help="Queues to take tasks from, separated by commas, '*' for all (as db_worker's --queue-name).",
        )
        parser.add_argument(
            "--exclude-queues",
            action="append",
            dest="excluded",
            metavar="QUEUES",
            help="Queues not to take tasks from, separated by commas (repeatable); only with --queue-name '*' "
            "(every queue), as db_worker's --exclude-queues.",
        )
        parser.add_argument(
            "--burst", action="store_true", help="Exit 0 once no task is ready and none is running."
        )
        parser.add_argument(
            "--batch",
            nargs="?",
            const=True,
            default=False,
            help="Run what is ready, then exit 0 (as db_worker's --batch; the same as --burst). The number of "
            "tasks claimed per statement, which --batch N set before, is --claim-batch N.",
        )
        # Numbers are checked in handle(), so that call_command(..., concurrency=0) is checked too.
        parser.add_argument(
            "--max-tasks", default=None, help="Exit 0 after this many tasks (default: no limit)."
        )
        parser.add_argument(
            "--concurrency", default=1, help="Tasks run at once (threads; 1 to 256, default 1)."
        )
        parser.add_argument(
            "--claim-batch",
            default=None,
            help="Tasks claimed per statement (1 to 1000; default: --concurrency).",
        )
        parser.add_argument(
            "--lease",
            default=None,
            help="Seconds a claim lasts (1 to 86400; default: OPTIONS['lease']).",
        )
        parser.add_argument(
            "--interval",
            default=None,
            help="Seconds an idle worker waits before looking for ready tasks again (0.01 to 86400; default: "
            "OPTIONS['poll_interval']), as db_worker's --interval. On PostgreSQL a NOTIFY wakes it sooner.",
        )
        parser.add_argument("--worker-id", default=None, help="The worker's name (default: host-pid-random).")
        parser.add_argument(
            "--no-periodic",
            action="store_true",
            help="Fire no periodic schedule (by default every worker fires them, each tick once; a worker started "
            "with this only runs tasks, and the others fire the ticks).",
        )
        # db_worker's options that have no meaning here, so that its unit files run unchanged where they can.
        parser.add_argument(
            "--no-startup-delay",
            action="store_true",
            help="Accepted for db_worker's unit files: lockkit_worker has no random delay at start.",
        )
        parser.add_argument(
            "--reload",
            action=argparse.BooleanOptionalAction,
            default=False,
            help="--no-reload is accepted for db_worker's unit files; --reload (restart on code changes) is not "
            "offered: restart the worker when you deploy.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the worker until stopped.

        Raises:
            CommandError: an unknown backend, a backend that is not lockkit's, a task table that does not exist
                (``migrate`` not run), ``--reload``, or a bad option (a numeric option out of its ``BOUNDS``,
                ``--batch`` with a number, ``--exclude-queues`` with named queues or leaving none) before any SQL
                and before any thread starts; the server refusing the alias's settings (a database or user it does
                not have, a wrong password), at once; or a runner that could not go on (its claims were given
                back).
        """
        if not options.get("skip_checks"):  # called as call_command(): absent unless given
            self.check(databases=[])
        if options["reload"]:
            raise CommandError(
                "lockkit_worker has no --reload: a restart in the middle of a task would leave its claim until "
                "the lease ends. Restart the worker when the code changes (systemd, your process manager or a "
                "file watcher sending SIGTERM: the running tasks finish first)"
            )
        if not isinstance(options["batch"], bool):
            raise CommandError(
                f"--batch N is now --claim-batch N (tasks claimed per statement): write --claim-batch "
                f"{options['batch']}. --batch alone means run what is ready, then exit, as django-tasks' db_worker"
            )
        numbers = {
            name: None
            if options[name.replace("-", "_")] is None
            else bounded(name, options[name.replace("-", "_")])
            for name in BOUNDS
        }
        backend = lockkit_backend(options["backend"])
        queues, excluded = _queues(backend, options, self.stderr.write)
        burst = bool(options["burst"] or options["batch"])

        def build() -> Worker:
            worker = Worker(
                backend,
                queues=queues,
                exclude_queues=excluded,
                concurrency=int(numbers["concurrency"] or 1),
                batch=None if numbers["claim-batch"] is None else int(numbers["claim-batch"]),
                lease=numbers["lease"],
                burst=burst,
                max_tasks=None if numbers["max-tasks"] is None else int(numbers["max-tasks"]),
                poll_interval=numbers["interval"],
                worker_id=options["worker_id"],
                periodic=not options["no_periodic"],
            )
            # On PostgreSQL nothing above asks the server, and the worker's first statement (the claims held under
            # its name) raised a raw OperationalError: a server down at start is waited out here, on every vendor.
            connections[worker.alias].ensure_connection()
            return worker

        try:
            worker = _when_reachable(build, backend.database(), burst=burst, write=self.stderr.write)
            if worker is None:
                return  # stopped (SIGTERM, Ctrl-C) while waiting for the database: nothing was claimed
        except (TypeError, ValueError) as error:
            named = {"queues ": "--queue/--queue-name: ", "worker_id ": "--worker-id: "}
            name = next((option for start, option in named.items() if str(error).startswith(start)), "")
            raise CommandError(f"{name}{error}") from error
        missing = _missing_tables(worker.alias, periodic=bool(worker.schedules), burst=burst)
        if missing:
            raise CommandError(
                f"the table(s) {', '.join(missing)} of lockkit.tasks do not exist on database {worker.alias!r}: "
                f"run `manage.py migrate --database {worker.alias}` first"
            )
        mismatch = naive_clock_mismatch(worker.alias)
        if mismatch:
            raise CommandError(mismatch)
        others = sorted(set(backend.queues) - set(worker.queues))
        if options["verbosity"] >= 1:  # on stderr, whether or not logging is configured (as db_worker's)
            self.stderr.write(
                f"lockkit_worker {worker.worker_id}: queues {worker.queues_taken()}; concurrency "
                f"{worker.concurrency}; claim batch {worker.batch}; lease {worker.lease:g}s; idle poll "
                f"{worker.poll_interval:g}s; backend "
                f"{backend.alias!r} on database {worker.alias!r}"
                + ("; until none is ready" if worker.burst else "")
                + (f"; at most {worker.max_tasks} task(s)" if worker.max_tasks else "")
                + (f"; {len(worker.schedules)} periodic schedule(s)" if worker.schedules else "")
                + (f"; not taking queue(s) {', '.join(others)} (--queue-name '*' for all)" if others else "")
            )
        try:
            stats = worker.run()  # SIGTERM/SIGINT: see Worker.run()
        except BaseException as failure:
            if isinstance(failure, TransactionManagementError) and failure is not worker.failure:
                raise CommandError(str(failure)) from failure  # run inside atomic() (a TestCase): nothing ran
            if failure is worker.drain_failure:
                done = worker.stats
                raise CommandError(
                    f"lockkit_worker --burst: the drain stopped, claiming failed: {failure} ({done.succeeded} "
                    f"succeeded, {done.failed} failed, {done.retried} retried before it; the tasks not run are "
                    f"left to the next run)"
                ) from failure
            if worker.failure is not failure:
                raise
            raise CommandError(
                f"worker {worker.worker_id} stopped: a runner could not go on after {failure!r} (its claims were "
                f"given back)"
            ) from failure
        if options["verbosity"] >= 1:
            self.stdout.write(
                f"worker {worker.worker_id}: {stats.succeeded} succeeded, {stats.failed} failed, "
                f"{stats.retried} retried, {stats.lost} lost, {stats.given_back} given back"
            )


def _when_reachable(
    build: Callable[[], Worker], alias: str, *, burst: bool, write: Callable[[str], Any]
) -> Worker | None:
    """``build()``, tried again every second while the database cannot be reached (a server down at start).

    ``SIGTERM`` or ``SIGINT`` while it waits stops the command as they stop a running worker: a line on stderr and
    exit status 0, nothing claimed (``None``), not a traceback.

    Some vendors' workers ask the server at start (MariaDB: its version, for the claims statements). A server that
    is down is waited out, as any later outage is; with ``--burst``/``--batch`` (a drain from cron or CI) it is
    a ``CommandError`` at once: the drain did not happen, and its exit status says so.

    Raises:
        CommandError: with ``burst``, the database could not be reached; any database error that is not a lost
            connection (the server refusing the alias's settings, ``DatabaseMisconfigured``, included: it is not
            waited for).
    """
    said = False
    on_main = threading.current_thread() is threading.main_thread()
    # Both stop signals, whatever this process inherited (a SIGINT ignored by the shell that started it), as the
    # running worker's handlers do (stopping.py).
    previous = {sig: signal.signal(sig, _interrupt) for sig in STOP_SIGNALS} if on_main else {}
    try:
        while True:
            try:
                return build()
            except DatabaseError as failure:
                said = _unreachable(failure, alias, burst=burst, said=said, write=write)
            time.sleep(1.0)  # a fixed pace between connection attempts, not a synchronisation
    except KeyboardInterrupt:
        write("lockkit_worker: stopped while waiting for the database; nothing was claimed")
        return None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _interrupt(number: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _unreachable(
    failure: DatabaseError, alias: str, *, burst: bool, said: bool, write: Callable[[str], Any]
) -> bool:
    """Say once that the database cannot be reached (``True`` from then on); raise when waiting is wrong."""
    error = translate(failure, alias=alias, nowait=False)
    if isinstance(error, DatabaseMisconfigured):
        raise refused_settings(error, alias, *_REFUSED) from failure
    if not isinstance(error, ConnectionLost):
        raise CommandError(f"lockkit_worker cannot start: {failure}") from failure
    if burst:
        raise CommandError(f"lockkit_worker --burst: the database cannot be reached: {failure}") from failure
    if not said:
        write(f"lockkit_worker: the database cannot be reached, trying again every second: {failure}")
    return True


def _missing_tables(alias: str, *, periodic: bool, burst: bool = False) -> list[str]:
    """The worker's tables that do not exist on ``alias`` (not migrated); none when the server cannot say now.

    A server that is down at start is ridden out by the worker's own retries, as later outages are (with
    ``burst``, a drain, it is a ``CommandError``: the drain cannot happen); a table that is missing is not a
    passing fault, and the worker would retry it for ever.

    Raises:
        CommandError: with ``burst``, the server could not be asked; the server refused the alias's settings (a
            database or user it does not have, a wrong password: waiting cannot help).
    """
    wanted = [QueuedTask._meta.db_table] + ([PeriodicSchedule._meta.db_table] if periodic else [])
    try:
        present = tables_present(alias, *_REFUSED)
    except DatabaseError as failure:
        if burst:
            raise CommandError(
                f"lockkit_worker --burst: the database cannot be reached: {failure}"
            ) from failure
        return []
    return [table for table in wanted if table.lower() not in present]


# How the worker says that the server refused its alias's settings (lockkit.tasks.management.database).
_REFUSED = ("lockkit_worker cannot start", ", or create the database or role; not retried")


def _queues(
    backend: DatabaseBackend, options: dict[str, Any], warn: Callable[[str], Any]
) -> tuple[list[str] | str, list[str]]:
    """The queues to work on: ``--queue``/``--queue-name`` (else Django's default queue), less ``--exclude-queues``.

    As db_worker: no queue named means the ``"default"`` queue only (Celery's worker too takes its default queue
    only), ``--queue-name '*'`` every queue of the backend, and ``--exclude-queues`` only with ``'*'``. A name
    excluded that is not a queue of the backend's is reported through ``warn`` (the worker goes on: a typo is
    visible, not fatal). Each option may be a string or a list of them (``call_command``).

    Returns:
        ``Worker``'s ``queues`` and ``exclude_queues``: the queues left, and none; or, for ``'*'`` on a backend
        whose ``QUEUES`` is empty (any queue name is valid), ``"*"`` and the queues excluded.

    Raises:
        CommandError: a ``--queue-name`` that names no queue (``''``, ``','``), no queue named on a backend whose
            ``QUEUES`` lacks ``"default"``, ``--exclude-queues`` without ``--queue-name '*'``, or no queue left.
    """
    named = _listed(options["queues"], "--queue")
    if options["queue_name"] is not None and not isinstance(options["queue_name"], str):
        raise CommandError(f"--queue-name takes queue names (a string), got {options['queue_name']!r}")
    every = options["queue_name"] == "*"
    if options["queue_name"] is not None and not every:
        listed = [q for q in options["queue_name"].split(",") if q]
        if not listed:
            raise CommandError(f"--queue-name: no queue named in {options['queue_name']!r} ('*' for all)")
        named += listed
    if not named and not every:
        if backend.queues and DEFAULT_TASK_QUEUE_NAME not in backend.queues:
            raise CommandError(
                f"backend {backend.alias!r} has no queue {DEFAULT_TASK_QUEUE_NAME!r} (its QUEUES: "
                f"{', '.join(sorted(backend.queues))}): name the queues to take with --queue-name, '*' for all"
            )
        named = [DEFAULT_TASK_QUEUE_NAME]
    queues = sorted(backend.queues) if every else named
    excluded = [
        q for given in _listed(options["excluded"], "--exclude-queues") for q in given.split(",") if q
    ]
    if excluded and not every:
        raise CommandError("--exclude-queues can only be used with --queue-name=*")
    if every and not backend.queues:  # any queue name is valid: every queue is any queue, less those excluded
        return "*", excluded
    for name in excluded:
        if backend.queues and name not in backend.queues:
            warn(f"--exclude-queues: {name!r} is not a queue of backend {backend.alias!r}")
    left = [q for q in dict.fromkeys(queues) if q not in excluded]
    if excluded and not left:
        raise CommandError(f"--exclude-queues: no queue left of {', '.join(queues)}")
    return left, []


def _listed(value: Any, option: str) -> list[str]:
    """An option given once or repeated: ``None``, a string (``call_command(exclude_queues="a,b")``) or a list.

    Raises:
        CommandError: ``value`` is another type (``call_command(exclude_queues=5)``), or holds a non-string.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise CommandError(f"{option} takes queue names (strings), got {value!r}")
    return list(value)
