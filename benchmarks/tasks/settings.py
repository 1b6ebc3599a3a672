"""Settings of the task-queue benchmark: lockkit.tasks, and django-tasks-db when it is installed.

The database is ``LOCKKIT_BENCH_DATABASE_URL`` (set by ``python -m benchmarks.tasks``). Both backends get the same
database, the same trivial task and the same polling interval.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from typing import Any

import dj_database_url

SECRET_KEY = "lockkit-benchmarks-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["lockkit", "lockkit.tasks"]
DATABASES: dict[str, dict[str, Any]] = {
    "default": dict(
        dj_database_url.parse(os.environ.get("LOCKKIT_BENCH_DATABASE_URL", ""), conn_max_age=None)
    )
}
#: Seconds an idle worker waits before looking again (both workers).
POLL = 0.05
TASKS: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": "lockkit.tasks.DatabaseBackend",
        # The benchmark's tasks (benchmarks/tasks/jobs.py) are in no installed app: allowed by name.
        "OPTIONS": {
            "lease": 30,
            "max_attempts": 1,
            "poll_interval": POLL,
            "task_modules": ["benchmarks.tasks"],
        },
    },
}
DJANGO_TASKS_DB = find_spec("django_tasks_db") is not None
if DJANGO_TASKS_DB:
    INSTALLED_APPS.append("django_tasks_db")
    TASKS["django_tasks_db"] = {"BACKEND": "django_tasks_db.DatabaseBackend"}
#: procrastinate (its Django app), when installed: its enqueue (``defer()``) is timed next to lockkit's.
PROCRASTINATE = find_spec("procrastinate") is not None
if PROCRASTINATE:
    INSTALLED_APPS.append("procrastinate.contrib.django")
# Django logs each task's start and end on the "django.tasks" logger at INFO; its default configuration builds
# those records and then drops them (the console handler logs only with DEBUG). Celery runs here with "-l WARNING",
# which builds none: the Django workers (lockkit's and db_worker) log at WARNING too, so all three log alike.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": "WARNING"},
    "loggers": {"django.tasks": {"level": "WARNING"}},
}
