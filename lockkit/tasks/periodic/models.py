"""``PeriodicSchedule``: one row per schedule, its last tick advanced by a guarded update (a tick fires once)."""

from __future__ import annotations

from django.db import models

__all__ = ["PeriodicSchedule"]


class PeriodicSchedule(models.Model):
    """The state of one schedule of ``TASKS[backend]["OPTIONS"]["periodic"]``, shared by every worker.

    A worker fires a tick by moving ``last_tick`` from the value it read to the tick, in the transaction that
    enqueues the task: of the workers that try, one moves it, the others update no row and enqueue nothing.

    Attributes:
        backend_name: The alias of the backend in ``settings.TASKS``.
        name: The schedule's name (its key in ``periodic``).
        task_path: The dotted path of its ``Task``, as last fired.
        cron: Its cron expression, as last fired.
        created_at: When a worker first saw it: ticks before are not fired.
        last_tick: The latest tick fired or skipped, ``NULL`` before the first.
        last_action: ``"fired"`` or ``"skipped"`` (``missed="skip"``, found late), for ``last_tick``.
        next_tick: The tick after ``last_tick`` (after ``created_at`` before the first).
    """

    backend_name = models.CharField(max_length=32)
    name = models.CharField(max_length=100)
    task_path = models.CharField(max_length=255)
    cron = models.CharField(max_length=255)
    created_at = models.DateTimeField()
    last_tick = models.DateTimeField(null=True, blank=True)
    last_action = models.CharField(max_length=10, blank=True, default="")
    next_tick = models.DateTimeField(null=True, blank=True)

    objects: models.Manager[PeriodicSchedule] = models.Manager()

    class Meta:
        """One row per (backend, name): the row every worker's guarded update meets."""

        app_label = "lockkit_tasks"
        constraints = (
            models.UniqueConstraint(fields=("backend_name", "name"), name="lockkit_tasks_periodic_name_uniq"),
        )
        ordering = ("backend_name", "name")
        verbose_name = "periodic schedule"

    def __str__(self) -> str:
        """``<name> (<cron>)``."""
        return f"{self.name} ({self.cron})"
