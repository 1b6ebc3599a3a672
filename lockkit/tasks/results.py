"""Building Django's ``TaskResult`` from a ``QueuedTask`` row, as ``get_result`` and the worker expose it."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core.exceptions import SuspiciousOperation
from django.tasks import task_backends
from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend
from django.utils.module_loading import import_string

from lockkit.tasks.errors import ReturnValueNotRecorded

if TYPE_CHECKING:
    from lockkit.tasks.models import QueuedTask


def check_task_path(path: str, task_modules: Iterable[str] = ()) -> None:
    """Refuse a task path lockkit would not import: checked before anything is imported.

    A path is accepted when it is dotted Python names (no ``<locals>``), has no ``__main__`` part, and its module is
    the module of an app in ``INSTALLED_APPS`` or inside it, or one of ``task_modules`` (the backend's
    ``OPTIONS["task_modules"]``) or inside it. A task table row can name any path: without this check, taking
    the row would import (run) any module on the worker's path, ``unittest.__main__`` included.

    Args:
        path: The dotted path (``Task.module_path``, ``QueuedTask.task_path``).
        task_modules: Further modules (dotted names) whose tasks may run.

    Raises:
        django.tasks.exceptions.InvalidTask: the path is refused; the message names it and why.
    """
    module, _, _name = path.rpartition(".")
    parts = path.split(".")
    if not module or not all(part.isidentifier() for part in parts) or "__main__" in parts:
        raise InvalidTask(
            f"task path {path!r} is not a module-level task of an importable module (dotted names, no "
            f"__main__): refused without importing it"
        )
    roots = [config.name for config in apps.get_app_configs()] + list(task_modules)
    if not any(module == root or module.startswith(root + ".") for root in roots):
        raise InvalidTask(
            f"task path {path!r} is in no app of INSTALLED_APPS nor in the backend's OPTIONS['task_modules']: "
            f"refused without importing it. Move the task into an installed app's module, or add {module!r} to "
            f"the backend's OPTIONS['task_modules']"
        )


def _task_modules(row: QueuedTask) -> list[str]:
    """The ``task_modules`` option of the row's backend (checked when the backend was built), else none."""
    try:
        backend = task_backends[row.backend_name]
    except InvalidTaskBackend:
        return []
    return list(backend.options.get("task_modules", []))


def task_of(row: QueuedTask) -> Task[..., Any]:
    """The ``Task`` the row was enqueued with (its ``priority``, ``queue_name`` and ``run_after`` too).

    The path is checked (``check_task_path``) before anything is imported.

    Raises:
        django.tasks.exceptions.InvalidTask: ``task_path`` is refused by ``check_task_path`` (nothing imported).
        ImportError: ``task_path`` cannot be imported any more.
        SuspiciousOperation: ``task_path`` names something that is not a ``Task``.
    """
    return _using(_imported(row), row)


def _imported(row: QueuedTask) -> Task[..., Any]:
    check_task_path(row.task_path, _task_modules(row))
    found = import_string(row.task_path)
    if not isinstance(found, Task):
        raise SuspiciousOperation(f"Task {row.id} does not point to a Task ({row.task_path})")
    return found


def _using(found: Task[..., Any], row: QueuedTask) -> Task[..., Any]:
    return found.using(
        priority=row.priority,
        queue_name=row.queue_name,
        run_after=row.run_after,
        backend=row.backend_name,
    )


class TaskCache:
    """``task_of`` for one worker: each ``task_path`` is imported once (at most ``size`` paths are kept).

    A row whose ``priority``, ``queue_name``, ``run_after`` and backend are the task's own gets the imported
    ``Task`` itself (equal to what ``using()`` would make); others get ``using()``'s copy, as ``task_of`` does.
    """

    def __init__(self, size: int = 512) -> None:
        """Keep at most ``size`` imported paths (the oldest is forgotten first)."""
        self._size = size
        self._found: dict[str, Task[..., Any]] = {}
        self._lock = threading.Lock()  # the worker's runner threads share it

    def task_of(self, row: QueuedTask) -> Task[..., Any]:
        """As the module's ``task_of``.

        Raises:
            InvalidTask, ImportError, SuspiciousOperation: as ``task_of``.
        """
        found = self._found.get(row.task_path)
        if found is None:
            found = _imported(row)
            with self._lock:
                if len(self._found) >= self._size:
                    del self._found[next(iter(self._found))]
                self._found[row.task_path] = found
        if (
            found.priority == row.priority
            and found.queue_name == row.queue_name
            and found.run_after == row.run_after
            and found.backend == row.backend_name
        ):
            return found
        return _using(found, row)


def errors_of(row: QueuedTask) -> list[TaskError]:
    """The row's errors as ``TaskError`` values, oldest first.

    An entry that is not an error object (a row edited by hand) is kept, as an error whose traceback shows it.
    """
    recorded = row.errors or []
    return [
        TaskError(exception_class_path=str(e["exception_class_path"]), traceback=str(e["traceback"]))
        if readable_error(e)
        else TaskError(exception_class_path="", traceback=f"an unreadable error entry: {e!r}")
        for e in (recorded if isinstance(recorded, list) else [recorded])
    ]


def readable_error(entry: object) -> bool:
    """Whether ``entry`` (one of a row's ``errors``) is an error object: its class path and traceback as text."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("exception_class_path"), str)
        and isinstance(entry.get("traceback"), str)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredTaskResult(TaskResult):  # type: ignore[type-arg,misc]
    """Django's ``TaskResult``, with the return value held in a public field of lockkit's own.

    Django keeps a result's return value in a private field that its constructor does not take; rather than write
    it, this subclass carries ``stored_return_value`` and answers ``return_value`` and ``refresh()`` from it, exactly
    as Django's do (``ValueError`` until the task succeeded). See
    https://docs.djangoproject.com/en/dev/ref/tasks/#django.tasks.TaskResult.return_value.

    Attributes:
        stored_return_value: What the task returned (JSON), or ``None`` until it succeeded.
        return_value_recorded: ``False`` when the task succeeded (its ``fenced()`` block committed) but its
            return value was not written: ``return_value`` raises ``ReturnValueNotRecorded``.
    """

    stored_return_value: Any = None
    return_value_recorded: bool = True

    @property
    def return_value(self) -> Any:
        """The task's return value.

        Raises:
            lockkit.tasks.errors.ReturnValueNotRecorded: the task succeeded (its ``fenced()`` block committed)
                but its value was not written: its worker stopped first, or the task raised after the block or
                returned a value JSON cannot hold (logged by the worker) (a ``ValueError``).
            ValueError: the task failed, or has not finished yet.
        """
        if self.status == TaskResultStatus.SUCCESSFUL:
            if not self.return_value_recorded:
                raise ReturnValueNotRecorded(
                    f"Task {self.id} succeeded (its fenced() block committed) but its return value was not "
                    f"recorded: its worker stopped or lost the database before writing it, or the task raised "
                    f"after the block or returned a value JSON cannot hold (then the worker's log says which)"
                )
            return self.stored_return_value
        if self.status == TaskResultStatus.FAILED:
            raise ValueError("Task failed")
        raise ValueError("Task has not finished yet")

    def refresh(self) -> None:
        """Reload the result's state from the backend, as Django's ``TaskResult.refresh()`` does."""
        self._copy(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        """Awaitable ``refresh()``."""
        self._copy(await self.task.get_backend().aget_result(self.id))

    def _copy(self, refreshed: TaskResult[..., Any]) -> None:
        for name in _REFRESHED:
            object.__setattr__(self, name, getattr(refreshed, name))  # this class's own (frozen) fields


# What refresh() reloads: Django's refreshable fields, with lockkit's return value in place of Django's private one.
_REFRESHED = (
    "errors",
    "finished_at",
    "started_at",
    "last_attempted_at",
    "status",
    "enqueued_at",
    "worker_ids",
    "stored_return_value",
    "return_value_recorded",
)


def result_of(row: QueuedTask, task: Task[..., Any] | None = None) -> TaskResult[..., Any]:
    """The row as a ``TaskResult`` (a ``StoredTaskResult``: ``return_value`` answers only once the task succeeded).

    Raises:
        InvalidTask, ImportError, SuspiciousOperation: as ``task_of`` (unless ``task`` is given).
        TypeError: as ``QueuedTask.arguments()``.
    """
    args, kwargs = row.arguments()
    return StoredTaskResult(
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
        stored_return_value=row.return_value if row.status == TaskResultStatus.SUCCESSFUL else None,
        return_value_recorded=row.return_value_recorded,
    )
