"""``lockkit.tasks.fenced()`` nested in the same task's ``fenced()`` block, under a worker: refused at once.

The inner block would complete the claim inside the outer block's transaction, and the outer block's own
completion would then find the claim ended and roll everything back: the task must not be reported (counted,
``task_finished``) as a success whose writes were rolled back.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished

from lockkit_tests.models import Owner
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, run_worker, vendor_aliases

POSTGRESQL, MARIADB, _ = vendor_aliases()


def _run_once(alias: str, job: Any, *args: Any) -> tuple[Any, Any, list[str]]:
    """Enqueue ``job(*args)`` with one attempt, run a worker: its result, the worker's stats, each ``task_finished``."""
    finished: list[str] = []

    def record(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append(str(task_result.status))

    task_finished.connect(record)
    try:
        with backend_on(alias, max_attempts=1) as backend:
            result = job.enqueue(*args)
            stats = run_worker(backend)
            result.refresh()
    finally:
        task_finished.disconnect(record)
    return result, stats, finished


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_fenced_block_nested_in_another_fails_the_attempt_and_is_never_reported_successful(
    alias: str,
) -> None:
    result, stats, finished = _run_once(alias, jobs.nested_fenced, "nested")
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"]
    assert "nested" in result.errors[0].traceback
    assert not Owner.objects.using(alias).filter(name__startswith="nested").exists()
    assert (stats.succeeded, stats.failed) == (0, 1)
    assert finished == [TaskResultStatus.FAILED]


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_fenced_block_rolled_back_by_the_task_s_own_atomic_is_not_taken_for_a_committed_success(
    alias: str,
) -> None:
    result, stats, finished = _run_once(alias, jobs.fenced_in_atomic_then_raise, "rolled back", alias)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]
    assert not Owner.objects.using(alias).filter(name="rolled back").exists()
    assert (stats.succeeded, stats.failed) == (0, 1)
    assert finished == [TaskResultStatus.FAILED]


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "SystemExit", "GeneratorExit"])
@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_base_exception_inside_a_fenced_block_rolls_it_back_and_fails_the_attempt(
    alias: str, kind: str
) -> None:
    with backend_on(alias, max_attempts=1) as backend:
        result = jobs.fenced_then_base_exception.enqueue("interrupted", kind)
        stats = run_worker(backend, concurrency=2)
        result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [f"builtins.{kind}"]
    assert not Owner.objects.using(alias).filter(name="interrupted").exists()
    assert (stats.succeeded, stats.failed) == (0, 1)
