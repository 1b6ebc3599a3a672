"""``manage.py lockkit_worker``: run the tasks of a ``lockkit.tasks.DatabaseBackend`` until stopped."""

from __future__ import annotations

import logging
import os
import signal
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend

from lockkit.tasks.backend import DatabaseBackend
from lockkit.tasks.worker import Worker

logger = logging.getLogger("lockkit.tasks.worker")


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
        parser.add_argument(
            "--concurrency", type=int, default=1, help="Tasks run at once (threads; default 1)."
        )
        parser.add_argument(
            "--batch", type=int, default=None, help="Tasks claimed per statement (default: --concurrency)."
        )
        parser.add_argument(
            "--lease", type=float, default=None, help="Seconds a claim lasts (default: OPTIONS['lease'])."
        )
        parser.add_argument("--worker-id", default=None, help="The worker's name (default: host-pid-random).")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the worker until stopped.

        Raises:
            CommandError: an unknown backend, a backend that is not lockkit's, or a bad option.
        """
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
                concurrency=options["concurrency"],
                batch=options["batch"],
                lease=options["lease"],
                burst=options["burst"],
                worker_id=options["worker_id"],
            )
        except (TypeError, ValueError) as error:
            raise CommandError(str(error)) from error
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(number: int, frame: FrameType | None) -> None:
            if worker.stopping.is_set():
                logger.warning("worker %s: second signal %d: stopping at once", worker.worker_id, number)
                os._exit(1)
            logger.info(
                "worker %s: signal %d: finishing running tasks, giving back the others",
                worker.worker_id,
                number,
            )
            worker.stop()

        for sig in previous:
            signal.signal(sig, on_signal)
        try:
            stats = worker.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if options["verbosity"] >= 1:
            self.stdout.write(
                f"worker {worker.worker_id}: {stats.succeeded} succeeded, {stats.failed} failed, "
                f"{stats.retried} retried, {stats.lost} lost, {stats.given_back} given back"
            )
