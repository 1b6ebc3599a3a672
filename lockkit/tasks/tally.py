"""What workers did and what waits: a task attempt's outcome counted (``task_counted``), the oldest ready task's age."""

from __future__ import annotations

from typing import Any

from django.db.models import Min, Q
from django.db.models.functions import Coalesce
from django.tasks import task_backends
from django.tasks.base import TaskResultStatus
from django.utils import timezone

from lockkit import events


def count(stats: Any, row: Any, outcome: str, *, alias: str) -> None:
    """Count ``outcome`` (a ``Stats`` field) for the task ``row`` (on ``alias``) in ``stats``; send ``task_counted``."""
    setattr(stats, outcome, getattr(stats, outcome) + 1)
    events.task_counted(
        type(stats), backend=row.backend_name, queue=row.queue_name, alias=alias, outcome=outcome
    )


def oldest_ready_age(backend: str = "default") -> float | None:
    """Seconds the oldest ready task of a lockkit tasks backend has been waiting, or ``None`` when none is ready.

    A task is ready when it is ``READY`` and due (``ready_at`` unset or past); it has waited since it became due
    (``ready_at``, else ``enqueued_at``). One query on the backend's database, on this thread's connection.

    Args:
        backend: The alias in ``settings.TASKS`` (a ``lockkit.tasks.DatabaseBackend``).

    Returns:
        The age in seconds (0 or more), or ``None``.

    Raises:
        django.tasks.exceptions.InvalidTaskBackend: no such backend.
        TypeError: ``backend`` is not a ``str``, or its backend is not a ``lockkit.tasks.DatabaseBackend``.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be an alias of settings.TASKS (a str), not {type(backend).__name__}")
    from lockkit.tasks.backend import DatabaseBackend
    from lockkit.tasks.models import QueuedTask

    configured = task_backends[backend]
    if not isinstance(configured, DatabaseBackend):
        raise TypeError(f"backend must name a lockkit.tasks.DatabaseBackend, not {type(configured).__name__}")
    now = timezone.now()
    oldest = (
        QueuedTask.objects.using(configured.database())
        .filter(
            Q(ready_at__isnull=True) | Q(ready_at__lte=now),
            status=TaskResultStatus.READY,
            backend_name=backend,
        )
        .aggregate(oldest=Min(Coalesce("ready_at", "enqueued_at")))["oldest"]
    )
    return None if oldest is None else max(0.0, (now - oldest).total_seconds())
