"""``QueuedTask``: one row per enqueued task, claimed by ``manage.py lockkit_worker`` through lockkit.claims."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskResultStatus

from lockkit.claims.mixin import Claimable
from lockkit.tasks.arguments import FloatKeepingEncoder, TextIfUnreadable, storable_text

__all__ = ["QueuedTask"]

#: The separator of ``QueuedTask.worker_log`` (worker names cannot contain it: the worker checks).
WORKER_SEPARATOR = "\n"


class QueuedTask(Claimable):
    """A task enqueued through ``lockkit.tasks.DatabaseBackend``, its state, and its result.

    ``status`` is Django's ``TaskResultStatus``: ``READY`` (waiting, or waiting to be retried), ``RUNNING``
    (claimed by a worker, see the ``Claimable`` fields), ``SUCCESSFUL`` or ``FAILED``. A task is ready to run
    when it is ``READY`` and ``ready_at`` is ``NULL`` or past by the database clock.

    Attributes:
        id: The task result's id (``TaskResult.id``), a UUID.
        backend_name: The alias of the backend in ``settings.TASKS``.
        queue_name: The task's queue.
        priority: -100 to 100 (Django's ``TASK_MIN_PRIORITY`` to ``TASK_MAX_PRIORITY``, checked by the database
            too); higher runs first.
        task_path: The dotted path of the ``Task`` object.
        takes_context: Whether the task function receives a ``TaskContext``.
        args_kwargs: ``{"args": [...], "kwargs": {...}}``, as JSON.
        run_after: The task's own ``run_after`` (``Task.run_after``), or ``NULL``.
        ready_at: The earliest the next attempt may start: ``run_after`` at first, then the retry's backoff.
        enqueued_at, started_at, finished_at, last_attempted_at: As ``TaskResult`` has them.
        return_value: The JSON return value of a successful run (floats written so that they stay floats).
        return_value_recorded: ``False`` while a task that ``lockkit.tasks.fenced()`` completed has not had its
            return value written: for good when its worker died (or kept failing to write) in between.
        errors: One ``{"exception_class_path", "traceback", "attempt"}`` per failed attempt.
        worker_log: The worker of each attempt, one per line (``TaskResult.worker_ids``), appended when claimed.
        retry_of: The ``id`` of the finished task this row runs again (the admin's "retry" action), or ``NULL``;
            a task is run again at most once (unique): retry the newest run.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    backend_name = models.CharField(max_length=32)
    queue_name = models.CharField(max_length=32)
    priority = models.SmallIntegerField(default=0)
    task_path = models.CharField(max_length=255)
    takes_context = models.BooleanField(default=False)
    args_kwargs = models.JSONField(encoder=FloatKeepingEncoder, decoder=TextIfUnreadable)
    status = models.CharField(max_length=10, choices=TaskResultStatus.choices, default=TaskResultStatus.READY)
    run_after = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    return_value = models.JSONField(
        null=True, blank=True, encoder=FloatKeepingEncoder, decoder=TextIfUnreadable
    )
    return_value_recorded = models.BooleanField(default=True)
    errors = models.JSONField(default=list, blank=True, decoder=TextIfUnreadable)
    worker_log = models.TextField(default="", blank=True)
    retry_of = models.UUIDField(null=True, blank=True, unique=True, editable=False)

    # Declared, so type checkers know it even where the app is not installed (Django < 6, mypy's plugin).
    objects: models.Manager[QueuedTask] = models.Manager()

    class Meta:
        """The indexes ``lockkit_worker`` claims and renews by, and ``lockkit_prune_tasks`` deletes by."""

        ordering = ("-priority", "enqueued_at")
        # Made by the migrations themselves, not declared here: the partial index of unfinished tasks in claim
        # order (PostgreSQL, SQLite; MariaDB/MySQL claim by the first index below), and the index of finished_at
        # that lockkit_prune_tasks deletes the oldest finished by (partial: finished tasks only, where the
        # database has partial indexes). Declared, a condition would raise a system check warning on every
        # command on MariaDB/MySQL. claimed_by: the heartbeat locks a worker's claims; on MariaDB/MySQL, without
        # an index it would lock (and wait for) every row it examines, other workers' included.
        indexes = (
            models.Index(fields=("status", "-priority", "enqueued_at"), name="lockkit_tasks_status_idx"),
            models.Index(fields=("claimed_by",), name="lockkit_tasks_worker_idx"),
        )
        constraints = (
            models.CheckConstraint(
                condition=models.Q(priority__range=(TASK_MIN_PRIORITY, TASK_MAX_PRIORITY)),
                name="lockkit_tasks_priority_range",
            ),
            # Workers find unfinished tasks by finished_at IS NULL (the partial index): a row set back to READY by
            # hand with its finished_at kept would never run, so the database refuses it.
            models.CheckConstraint(
                condition=models.Q(finished_at__isnull=True)
                | ~models.Q(status__in=(TaskResultStatus.READY, TaskResultStatus.RUNNING)),
                name="lockkit_tasks_unfinished_not_finished",
            ),
        )
        verbose_name = "task"

    def __str__(self) -> str:
        """``<task path> <id> (<status>)``."""
        return f"{self.task_path} {self.id} ({self.status})"

    @property
    def task_name(self) -> str:
        """The task function's name (``Task.name``): the last part of ``task_path``, read without importing it."""
        return self.task_path.rpartition(".")[2]

    @property
    def worker_ids(self) -> list[str]:
        """The worker of each attempt, oldest first (``TaskResult.worker_ids``)."""
        return [name for name in self.worker_log.split(WORKER_SEPARATOR) if name]

    def arguments(self) -> tuple[list[Any], dict[str, Any]]:
        """The stored ``(args, kwargs)``.

        Raises:
            TypeError: ``args_kwargs`` is not ``{"args": [...], "kwargs": {...}}`` (the row was edited by hand).
        """
        stored = self.args_kwargs or {}
        args = stored.get("args", []) if isinstance(stored, dict) else None
        kwargs = stored.get("kwargs", {}) if isinstance(stored, dict) else None
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise TypeError(
                f"task {self.pk}: args_kwargs must be an object {{'args': [...], 'kwargs': {{...}}}}, got "
                f"{storable_text(repr(stored), 1000)}"
            )
        return list(args), dict(kwargs)


# Periodic tasks keep their state in a model of their own package; imported here, it is part of the app.
from lockkit.tasks.periodic.models import PeriodicSchedule  # noqa: E402

__all__ += ["PeriodicSchedule"]
