"""The worker's hook: ``Periodic.fire_due()``, once per loop iteration, enqueues each due tick exactly once.

Each schedule has one row (``PeriodicSchedule``). Firing a tick is one transaction: an ``UPDATE`` that moves
``last_tick`` from the value this worker read to the tick, and, when it updated the row, the enqueue. Two workers
that try the same tick meet on the row: the second waits for the first's commit, then matches no row and enqueues
nothing. The row outlives the workers, so a restart neither repeats nor forgets a tick.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError
from django.utils import timezone

from lockkit.scopes.blocks import locked
from lockkit.tasks.periodic.declared import all_schedules
from lockkit.tasks.periodic.models import PeriodicSchedule
from lockkit.tasks.periodic.schedules import Schedule, resolve

if TYPE_CHECKING:
    from django.tasks.base import Task

    from lockkit.tasks.backend import DatabaseBackend

logger = logging.getLogger("lockkit.tasks.periodic")

#: Seconds before trying again after a database error.
RETRY_AFTER = 1.0


class Periodic:
    """The periodic schedules of one backend, as one worker fires them.

    Args:
        backend: The ``DatabaseBackend`` (its ``periodic`` option, and the schedules ``@periodic_task`` declares).
        alias: The database alias of the task table.
        fire: ``False``: this worker fires no schedule (``lockkit_worker --no-periodic``; others fire them), and
            none is resolved or imported.

    Raises:
        TypeError: ``fire`` is not a bool.
        django.core.exceptions.ImproperlyConfigured: a schedule's task cannot be resolved, or two schedules have
            one name (the message names the setting). Nothing touches the database here.
        ImportError: an app's ``tasks`` module, or one of ``task_modules``, fails to import.
    """

    def __init__(self, backend: DatabaseBackend, alias: str, *, fire: bool = True) -> None:
        """Resolve each schedule's task (importing it): a bad path fails when the worker starts."""
        if not isinstance(fire, bool):
            raise TypeError(f"periodic must be True or False, got {fire!r}")
        self.backend = backend
        self.alias = alias
        self.schedules = all_schedules(backend) if fire else ()
        self._tasks: dict[str, Task[..., Any]] = {s.name: resolve(s, backend) for s in self.schedules}
        self._rows: dict[str, PeriodicSchedule] = {}
        # When each schedule is due next, as this worker last read it: until then, no query.
        self._due: dict[str, datetime | None] = {}
        self._pause_until = 0.0

    def fire_due(self) -> None:
        """Enqueue the due tick of each schedule, unless another worker did; an error is logged, never raised.

        A database error, or another (a ``task_enqueued`` receiver's, raised in the tick's transaction, which rolls
        back), is logged and the schedules are read again after ``RETRY_AFTER`` seconds.
        """
        if not self.schedules or time.monotonic() < self._pause_until:
            return
        now = timezone.now()
        if self._rows and not any(due is not None and due <= now for due in self._due.values()):
            return
        try:
            if not self._rows:
                self._load(now)
            for schedule in self.schedules:
                due = self._due[schedule.name]
                if due is not None and due <= now:
                    self._fire(schedule, now)
        except DatabaseError as failure:
            self._rows.clear()  # read again: the failure may have been a lost commit
            self._pause_until = time.monotonic() + RETRY_AFTER
            logger.warning("periodic tasks of backend %r: %s; trying again", self.backend.alias, failure)
        except Exception:  # a task_enqueued receiver's, say: the tick rolled back; it never ends the worker
            self._rows.clear()
            self._pause_until = time.monotonic() + RETRY_AFTER
            logger.exception("periodic tasks of backend %r failed; trying again", self.backend.alias)

    def wait(self, at_most: float) -> float:
        """Seconds the worker may wait before calling ``fire_due()`` again: to the next tick, at most ``at_most``.

        An idle worker waits no longer than this, so it fires each tick on time however long its ``poll_interval``
        (a tick found late is fired as one task for the ticks passed, or skipped, as ``missed`` says). By this
        worker's clock, as ``fire_due()`` decides; after a failure, until its pause ends. At least a millisecond:
        a tick due now is fired by the next call.

        Args:
            at_most: The longest wait the worker has otherwise (seconds).

        Returns:
            The wait, in seconds.
        """
        if not self.schedules:
            return at_most
        paused = self._pause_until - time.monotonic()
        if paused > 0:
            return min(at_most, paused)
        dues = [due for due in self._due.values() if due is not None] if self._rows else []
        if not dues:  # nothing read yet (the next call reads the rows), or no tick ahead
            return at_most
        return min(at_most, max((min(dues) - timezone.now()).total_seconds(), 0.001))

    def _load(self, now: datetime) -> None:
        """Read every schedule's row, creating the missing ones (a new schedule fires from now on)."""
        rows = PeriodicSchedule.objects.using(self.alias).filter(backend_name=self.backend.alias)
        new = [
            PeriodicSchedule(
                backend_name=self.backend.alias,
                name=s.name,
                task_path=s.task,
                cron=s.cron,
                created_at=now,
                next_tick=s.after(now),
            )
            for s in self.schedules
        ]
        # INSERT ... ON CONFLICT DO NOTHING / INSERT IGNORE: workers starting together create each row once.
        PeriodicSchedule.objects.using(self.alias).bulk_create(new, ignore_conflicts=True)
        # Each schedule's row as the database matches its name: a collation that ignores case, accents or trailing
        # spaces (MariaDB's default) gives two such names one row, which only the first of them fires.
        self._rows = {}
        named: dict[Any, str] = {}  # the schedule that took each row, by its key
        for schedule in self.schedules:
            row = rows.filter(name=schedule.name).order_by("pk").first()
            if row is not None and row.pk in named:
                logger.error(
                    "periodic tasks of backend %r: schedules %r and %r are one row of database %r (its collation "
                    "compares them equal): %r is not fired; rename it",
                    self.backend.alias, named[row.pk], schedule.name, self.alias, schedule.name,
                )  # fmt: skip
            elif row is not None:
                named[row.pk] = schedule.name
                self._rows[schedule.name] = row
        for schedule in self.schedules:
            self._due[schedule.name] = self._next(schedule) if schedule.name in self._rows else None
            row = self._rows.get(schedule.name)
            if row is not None and (row.cron, row.task_path) != (schedule.cron, schedule.task):
                # The schedule changed since the row was written (a deploy): the admin shows what now fires.
                rows.filter(pk=row.pk).update(
                    cron=schedule.cron, task_path=schedule.task, next_tick=self._due[schedule.name]
                )
                row.cron, row.task_path = schedule.cron, schedule.task

    def _next(self, schedule: Schedule) -> datetime | None:
        row = self._rows[schedule.name]
        return schedule.after(row.last_tick or row.created_at)

    def _fire(self, schedule: Schedule, now: datetime) -> None:
        row = self._rows[schedule.name]
        tick = schedule.latest(now)
        if tick is None or tick <= (row.last_tick or row.created_at):
            self._due[schedule.name] = self._next(schedule)
            return
        on_time = (now - tick).total_seconds() <= schedule.grace
        action = "fired" if schedule.missed == "once" or on_time else "skipped"
        following = schedule.after(tick)
        guard = {"last_tick": row.last_tick} if row.last_tick is not None else {"last_tick__isnull": True}
        with locked(using=self.alias):
            moved = (
                PeriodicSchedule.objects.using(self.alias)
                .filter(pk=row.pk, **guard)
                .update(
                    last_tick=tick,
                    last_action=action,
                    next_tick=following,
                    task_path=schedule.task,
                    cron=schedule.cron,
                )
            )
            if moved and action == "fired":
                task = self._tasks[schedule.name].using(run_after=tick)
                self.backend.enqueue(task, list(schedule.args), dict(schedule.kwargs))
        if not moved:  # another worker took this tick (or a later one): read the row again
            fresh = PeriodicSchedule.objects.using(self.alias).filter(pk=row.pk).first()
            if fresh is None:  # deleted (the admin): created again on the next call
                self._rows.clear()
                return
            self._rows[schedule.name] = fresh
            self._due[schedule.name] = self._next(schedule)
            return
        row.last_tick = tick
        self._due[schedule.name] = following
        if action == "skipped":
            logger.info("periodic task %r: tick %s found late, skipped", schedule.name, tick.isoformat())
