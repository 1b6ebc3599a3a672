"""Building Django's ``TaskResult`` from a ``QueuedTask`` row, as ``get_result`` and the worker expose it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import SuspiciousOperation
from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from lockkit.tasks.models import QueuedTask


def task_of(row: QueuedTask) -> Task[..., Any]:
    """The ``Task`` the row was enqueued with (its ``priority``, ``queue_name`` and ``run_after`` too).

    Raises:
        ImportError: ``task_path`` cannot be imported any more.
        SuspiciousOperation: ``task_path`` names something that is not a ``Task``.
    """
    found = import_string(row.task_path)
    if not isinstance(found, Task):
        raise SuspiciousOperation(f"Task {row.id} does not point to a Task ({row.task_path})")
    return found.using(
        priority=row.priority,
        queue_name=row.queue_name,
        run_after=row.run_after,
        backend=row.backend_name,
    )


def errors_of(row: QueuedTask) -> list[TaskError]:
    """The row's errors as ``TaskError`` values, oldest first."""
    return [
        TaskError(exception_class_path=str(e["exception_class_path"]), traceback=str(e["traceback"]))
        for e in row.errors or []
    ]


def result_of(row: QueuedTask, task: Task[..., Any] | None = None) -> TaskResult[..., Any]:
    """The row as Django's ``TaskResult`` (``return_value`` set only when the task succeeded).

    Raises:
        ImportError, SuspiciousOperation: as ``task_of`` (unless ``task`` is given).
    """
    args, kwargs = row.arguments()
    result: TaskResult[..., Any] = TaskResult(
        task=task if task is not None else task_of(row),
        id=str(row.id),
        status=TaskResultStatus(row.status),
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_attempted_at=row.last_attempted_at,
        args=args,
        kwargs=kwargs,
        backend=row.backend_name,
        errors=errors_of(row),
        worker_ids=row.worker_ids,
    )
    if row.status == TaskResultStatus.SUCCESSFUL:
        _set(result, "_return_value", row.return_value)
    return result


def _set(result: TaskResult[..., Any], name: str, value: Any) -> None:
    # TaskResult is a frozen dataclass; Django's own backends set its fields the same way.
    object.__setattr__(result, name, value)
