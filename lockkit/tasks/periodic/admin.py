"""The admin of periodic tasks: each schedule with its last and next tick, read-only (workers own the rows)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from lockkit.tasks.backend import task_database
from lockkit.tasks.periodic.models import PeriodicSchedule

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[PeriodicSchedule]
else:  # ModelAdmin is generic for type checkers only (django-stubs); at run time it takes no subscript
    _ModelAdmin = admin.ModelAdmin


class PeriodicScheduleAdmin(_ModelAdmin):
    """Schedules as workers left them; one removed from the settings may be deleted (a worker recreates a live one)."""

    list_display = ("name", "backend_name", "task_path", "cron", "last_tick", "last_action", "next_tick")
    list_filter = ("backend_name",)
    search_fields = ("name", "task_path")

    def get_queryset(self, request: HttpRequest) -> QuerySet[PeriodicSchedule]:
        """The schedules on the task table's database (``OPTIONS["database"]`` of the lockkit backends).

        The list, a schedule's page and the deletes read (and delete) there, as the tasks' admin does
        (``lockkit.tasks.backend.task_database``).
        """
        return super().get_queryset(request).using(task_database())

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Schedules are declared in settings, never added by hand."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: PeriodicSchedule | None = None) -> bool:
        """Read-only: a worker may be firing a tick."""
        return False

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Django's delete page, its confirming request in one transaction on the schedules' database.

        Django opens it on the router's alias for the model, which is not the schedules' when ``OPTIONS["database"]``
        names another one.
        """
        with transaction.atomic(using=task_database()):
            return super().delete_view(request, object_id, extra_context)


# Django imports the app's admin.py only when django.contrib.admin is installed, and that module imports this one.
if apps.is_installed("django.contrib.admin"):
    admin.site.register(PeriodicSchedule, PeriodicScheduleAdmin)
