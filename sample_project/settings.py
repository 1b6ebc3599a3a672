"""Django settings for the sample project.

The database is PostgreSQL at ``SAMPLE_DATABASE_URL`` (or ``DATABASE_URL``); importing these settings without
either fails with ``ImproperlyConfigured``. They start nothing: ``python -m sample_project`` starts an embedded
server when no URL is given and exports its URL before Django reads this module. Requests are atomic (``ATOMIC_REQUESTS``) unless
a view opts out with ``transaction.non_atomic_requests``: the views that own their locked operation opt out,
so lockkit can retry them in fresh transactions; one view stays atomic to show the nested case failing fast.
"""

from __future__ import annotations

import os
from typing import Any

import dj_database_url
import django
from django.core.exceptions import ImproperlyConfigured

DATABASE_URL_ENV = "SAMPLE_DATABASE_URL"


def _database_url() -> str:
    for name in (DATABASE_URL_ENV, "DATABASE_URL"):
        url = os.environ.get(name, "").strip()
        if url:
            return url
    raise ImproperlyConfigured(
        f"Set {DATABASE_URL_ENV} (or DATABASE_URL) to a PostgreSQL URL, e.g. postgres://postgres@127.0.0.1:5432/sample,"
        " or run `python -m sample_project demo|serve|manage`, which starts an embedded PostgreSQL when none is set."
    )


SECRET_KEY = os.environ.get("SAMPLE_SECRET_KEY", "sample-project-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
INSTALLED_APPS = ["lockkit", "sample_project.inventory", "sample_project.jobs"]
# Django 6: the job queue's tasks (sample_project/jobs/tasks.py) run on lockkit.tasks, `manage lockkit_worker`.
if django.VERSION >= (6, 0):
    INSTALLED_APPS.append("lockkit.tasks")
    TASKS: dict[str, dict[str, Any]] = {
        "default": {
            "BACKEND": "lockkit.tasks.DatabaseBackend",
            # The demo's crash task (sample_project/demo/task_queue.py) is in no installed app: allowed by name.
            "OPTIONS": {"lease": 30, "max_attempts": 3, "task_modules": ["sample_project.demo.task_queue"]},
        }
    }
# A JSON API for a demo: no sessions, no CSRF middleware. A real project keeps its usual middleware.
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "sample_project.urls"
WSGI_APPLICATION = "sample_project.wsgi.application"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_default: dict[str, Any] = dict(dj_database_url.parse(_database_url(), conn_max_age=60))
_default["ATOMIC_REQUESTS"] = True
DATABASES: dict[str, dict[str, Any]] = {"default": _default}

# Prometheus metrics of every locked operation, lock and claim, served at /metrics.
LOCKKIT: dict[str, Any] = {"LOCK_TIMEOUT": 2.0, "OBSERVERS": ["lockkit.contrib.prometheus.install"]}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"lockkit": {"handlers": ["console"], "level": "WARNING"}},
}
