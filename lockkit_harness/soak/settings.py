"""The sample project's settings plus the soak's audit app; long-lived connections, as a worker runs them."""

from __future__ import annotations

from sample_project.settings import *  # noqa: F403 - the soak runs the sample exactly as configured
from sample_project.settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "lockkit_harness.soak"]
DATABASES["default"]["CONN_MAX_AGE"] = None  # a worker's connection lives as long as the process
DATABASES["default"]["ATOMIC_REQUESTS"] = False
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"lockkit": {"level": "CRITICAL"}},
}
