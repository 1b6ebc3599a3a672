"""The Django app of ``lockkit.tasks``: its task table, its admin and the ``lockkit_worker`` command."""

from __future__ import annotations

from django.apps import AppConfig


class TasksConfig(AppConfig):
    """``INSTALLED_APPS += ["lockkit.tasks"]``: the ``QueuedTask`` table (migrations) and ``lockkit_worker``."""

    name = "lockkit.tasks"
    label = "lockkit_tasks"
    verbose_name = "lockkit tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the receivers that keep a worker's run apart from a task another backend runs inside it."""
        from lockkit.tasks.running import connect_receivers  # models load after the registry

        connect_receivers()
