"""A task run by ``lockkit_worker`` that runs another task through Django's ``ImmediateBackend`` (at once, in its
own thread): the inner task's ``fenced()`` is a plain locked scope, as under ``ImmediateBackend`` anywhere; it
neither completes the worker's task nor uses up its ``fenced()``.
"""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus, task_backends
from django.test import override_settings

from lockkit.tasks import DatabaseBackend
from lockkit_tests.models import Owner
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, run_worker, tasks_setting


@pytest.mark.django_db(transaction=True, databases=["default"], available_apps=APPS)
def test_an_immediate_task_run_inside_a_worker_task_does_not_take_its_fenced_block() -> None:
    setting = {
        **tasks_setting("default", max_attempts=1),
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
    }
    with override_settings(TASKS=setting):
        backend = task_backends["default"]
        assert isinstance(backend, DatabaseBackend)
        result = jobs.immediate_then_fenced.enqueue("outer")
        stats = run_worker(backend)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == "outer"  # written after the worker task's own block, not the inner one's
    assert result.errors == []
    assert sorted(Owner.objects.values_list("name", flat=True)) == ["outer", "outer-inner"]
    assert (stats.succeeded, stats.failed) == (1, 0)
