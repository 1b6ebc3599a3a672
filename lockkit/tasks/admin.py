"""The admin of ``lockkit.tasks``: a read-only list of tasks, filtered by status and queue, and a "retry" action."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.tasks.base import TaskResultStatus

from lockkit.tasks.models import QueuedTask

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[QueuedTask]
else:  # ModelAdmin is generic for type checkers only (django-stubs); at run time it takes no subscript
    _ModelAdmin = admin.ModelAdmin


class QueuedTaskAdmin(_ModelAdmin):
    """Tasks as workers left them: read-only (workers own the rows), with "retry" for finished ones."""

    list_display = (
        "id",
        "task_path",
        "status",
        "queue_name",
        "priority",
        "attempts",
        "enqueued_at",
        "finished_at",
    )
    list_filter = ("status", "queue_name", "backend_name")
    search_fields = ("id", "task_path", "claimed_by")
    ordering = ("-enqueued_at",)
    actions = ("retry",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Tasks are enqueued by code, never added by hand."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: QueuedTask | None = None) -> bool:
        """Read-only: a worker may be writing the row."""
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: QueuedTask | None = None) -> Any:
        """Every field."""
        return [f.name for f in self.model._meta.fields]

    @admin.action(description="Retry the selected finished tasks", permissions=["view"])
    def retry(self, request: HttpRequest, queryset: QuerySet[QueuedTask]) -> None:
        """Make the selected ``FAILED``/``SUCCESSFUL`` tasks ``READY`` again, unclaimed (running ones are left)."""
        finished = queryset.filter(
            status__in=(TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL), lease_expires_at__isnull=True
        )
        count = finished.update(
            status=TaskResultStatus.READY, ready_at=None, finished_at=None, return_value=None, worker_log="",
            errors=[],
        )  # fmt: skip
        self.message_user(request, f"{count} task(s) will run again.", messages.SUCCESS)


# Django imports admin.py only when django.contrib.admin is installed; the check lets the class be imported anyway.
if apps.is_installed("django.contrib.admin"):
    admin.site.register(QueuedTask, QueuedTaskAdmin)

# The periodic schedules' admin (registered on import).
from lockkit.tasks.periodic import admin as periodic_admin  # noqa: E402, F401
