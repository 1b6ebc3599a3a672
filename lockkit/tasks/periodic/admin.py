"""The admin of periodic tasks: each schedule with its last and next tick, read-only (workers own the rows)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import apps
from django.contrib import admin
from django.http import HttpRequest

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

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Schedules are declared in settings, never added by hand."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: PeriodicSchedule | None = None) -> bool:
        """Read-only: a worker may be firing a tick."""
        return False


# Django imports the app's admin.py only when django.contrib.admin is installed, and that module imports this one.
if apps.is_installed("django.contrib.admin"):
    admin.site.register(PeriodicSchedule, PeriodicScheduleAdmin)
