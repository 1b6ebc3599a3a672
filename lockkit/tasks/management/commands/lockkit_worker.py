"""``manage.py lockkit_worker``: run the tasks of a ``lockkit.tasks.DatabaseBackend`` until stopped."""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend

from lockkit.tasks.backend import DatabaseBackend
from lockkit.tasks.worker import Worker

logger = logging.getLogger("lockkit.tasks.worker")

#: The allowed range of each numeric option: (lowest, highest, whether a fraction is allowed). See docs/tasks.md.
BOUNDS: dict[str, tuple[int, int, bool]] = {
    "concurrency": (1, 256, False),
    "batch": (1, 1000, False),
    "lease": (1, 86400, True),
}


def bounded(name: str, value: object) -> int | float:
    """``value`` of option ``--name`` as a number within its ``BOUNDS``.

    Args:
        name: The option's name without its dashes (a key of ``BOUNDS``).
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
    """``manage.py lockkit_worker [--backend B] [--queue Q ...] [--burst] [--concurrency N] [--batch N] [--lease S]``.

    ``SIGTERM`` or ``SIGINT`` (Ctrl-C): the running tasks finish, claimed tasks not started are given back, and
    the command exits 0. A second signal stops at once (exit 1); the tasks it was running are taken again by
    another worker when their lease ends. See docs/tasks.md.
    """

    help = (
        "Run the tasks of a lockkit.tasks.DatabaseBackend: claim ready tasks (SKIP LOCKED, leases, fencing "
        "tokens), run them, record their results; retry failures with backoff up to max_attempts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        """The options."""
        parser.add_argument(
            "--backend", default="default", help="The alias in settings.TASKS (default: default)."
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="QUEUE",
            help="A queue to take tasks from (repeatable; default: every queue of the backend).",
        )
        parser.add_argument(
            "--burst", action="store_true", help="Exit 0 once no task is ready and none is running."
        )
        # Numbers are checked in handle(), so that call_command(..., concurrency=0) is checked too.
        parser.add_argument(
            "--concurrency", default=1, help="Tasks run at once (threads; 1 to 256, default 1)."
        )
        parser.add_argument(
            "--batch", default=None, help="Tasks claimed per statement (1 to 1000; default: --concurrency)."
        )
        parser.add_argument(
            "--lease",
            default=None,
            help="Seconds a claim lasts (1 to 86400; default: OPTIONS['lease']).",
        )
        parser.add_argument("--worker-id", default=None, help="The worker's name (default: host-pid-random).")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the worker until stopped.

        Raises:
            CommandError: an unknown backend, a backend that is not lockkit's, or a bad option (a numeric option
                out of its ``BOUNDS`` is refused before any SQL and before any thread starts).
        """
        concurrency = int(bounded("concurrency", options["concurrency"]))
        batch = None if options["batch"] is None else int(bounded("batch", options["batch"]))
        lease = None if options["lease"] is None else float(bounded("lease", options["lease"]))
        try:
            backend = task_backends[options["backend"]]
        except InvalidTaskBackend as error:
            raise CommandError(f"--backend: {error}") from error
        if not isinstance(backend, DatabaseBackend):
            raise CommandError(
                f"--backend {options['backend']!r} is {type(backend).__module__}.{type(backend).__qualname__}, "
                f"not lockkit.tasks.DatabaseBackend"
            )
        queues = options["queues"] or sorted(backend.queues)
        try:
            worker = Worker(
                backend,
                queues=queues,
                concurrency=concurrency,
                batch=batch,
                lease=lease,
                burst=options["burst"],
                worker_id=options["worker_id"],
            )
        except (TypeError, ValueError) as error:
            raise CommandError(str(error)) from error
        try:
            stats = worker.run()  # SIGTERM/SIGINT: see Worker.run()
        except BaseException as failure:
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
