"""The admin: read-only, filtered by status/queue/backend, and "retry" making finished tasks ready again."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.sites import AdminSite
from django.tasks import TaskResultStatus
from django.test import RequestFactory

from lockkit.tasks.admin import QueuedTaskAdmin
from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, run_worker, vendor_aliases


class RecordingAdmin(QueuedTaskAdmin):
    """The real admin, recording its messages instead of needing the messages middleware."""

    messages: list[str]

    def message_user(self, request: Any, message: Any, *args: Any, **kwargs: Any) -> None:
        self.messages.append(str(message))


def test_admin_configuration_passes_djangos_checks() -> None:
    assert QueuedTaskAdmin(QueuedTask, AdminSite()).check() == []


def test_admin_is_read_only() -> None:
    model_admin = QueuedTaskAdmin(QueuedTask, AdminSite())
    request = RequestFactory().get("/")
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert set(model_admin.get_readonly_fields(request)) == {f.name for f in QueuedTask._meta.fields}
    assert model_admin.list_filter == ("status", "queue_name", "backend_name")


@pytest.mark.parametrize("alias", vendor_aliases())
def test_retry_action_makes_finished_tasks_ready_and_leaves_others(alias: str) -> None:
    with backend_on(alias, max_attempts=1) as backend:
        failed = jobs.failing_task_value_error.enqueue()
        done = jobs.calculate_meaning_of_life.enqueue()
        run_worker(backend)
        waiting = jobs.noop_task.enqueue()
        model_admin = RecordingAdmin(QueuedTask, AdminSite())
        model_admin.messages = []
        request = RequestFactory().post("/")
        model_admin.retry(request, QueuedTask.objects.using(alias).all())
        assert model_admin.messages == ["2 task(s) will run again."]
        statuses = dict(QueuedTask.objects.using(alias).values_list("pk", "status"))
        assert {str(pk): status for pk, status in statuses.items()} == {
            failed.id: TaskResultStatus.READY,
            done.id: TaskResultStatus.READY,
            waiting.id: TaskResultStatus.READY,
        }
        assert sorted(run_worker(backend).ids) == sorted([failed.id, done.id, waiting.id])
        failed.refresh()
        assert failed.status == TaskResultStatus.FAILED
        assert failed.attempts == 1  # a fresh attempt budget
