"""The worker's ``TaskCache``: each task path imported once, each row's own options kept (as ``task_of`` gives)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.core.exceptions import SuspiciousOperation

from lockkit.tasks import results
from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs


def _row(path: str, **options: object) -> QueuedTask:
    values: dict[str, object] = {
        "task_path": path,
        "priority": 0,
        "queue_name": "default",
        "run_after": None,
        "backend_name": "default",
        **options,
    }
    return QueuedTask(**values)


NOOP = f"{jobs.__name__}.noop_task"
ECHO = f"{jobs.__name__}.echo"


def test_a_row_with_the_tasks_own_options_gets_the_imported_task_itself() -> None:
    cache = results.TaskCache()
    first = cache.task_of(_row(NOOP))
    assert first is jobs.noop_task
    assert cache.task_of(_row(NOOP)) is first


@pytest.mark.parametrize(
    "options",
    [
        {"priority": 7},
        {"run_after": datetime(2030, 1, 1, tzinfo=UTC)},
        {"priority": -3, "run_after": datetime(2031, 6, 1, tzinfo=UTC)},
    ],
)
def test_a_row_with_other_options_gets_them_as_task_of_does(options: dict[str, object]) -> None:
    cache = results.TaskCache()
    cache.task_of(_row(NOOP))  # imported and kept
    row = _row(NOOP, **options)
    made = cache.task_of(row)
    assert made == results.task_of(row)
    assert (made.priority, made.queue_name, made.run_after, made.backend) == (
        row.priority,
        row.queue_name,
        row.run_after,
        row.backend_name,
    )
    assert jobs.noop_task.priority == 0  # the imported task is not changed


def test_the_oldest_path_is_forgotten_beyond_the_size_and_answers_stay_right() -> None:
    cache = results.TaskCache(size=1)
    for path, task in [(NOOP, jobs.noop_task), (ECHO, jobs.echo), (NOOP, jobs.noop_task), (ECHO, jobs.echo)]:
        assert cache.task_of(_row(path)) is task


def test_a_path_that_is_not_a_task_is_refused_and_not_kept() -> None:
    cache = results.TaskCache()
    with pytest.raises(SuspiciousOperation, match="does not point to a Task"):
        cache.task_of(_row(f"{jobs.__name__}.Any"))
    with pytest.raises(ImportError):
        cache.task_of(_row(f"{jobs.__name__}.no_such_task"))
    with pytest.raises(SuspiciousOperation):  # still refused: a refusal is never cached
        cache.task_of(_row(f"{jobs.__name__}.Any"))
