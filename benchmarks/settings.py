"""Django settings for the benchmarks: one database, from ``LOCKKIT_BENCH_DATABASE_URL`` (set by the CLI).

Persistent connections (``CONN_MAX_AGE=None``), as a real worker process keeps its connection between operations.
"""

from __future__ import annotations

import os
from typing import Any

import dj_database_url

SECRET_KEY = "lockkit-benchmarks-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["benchmarks"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES: dict[str, dict[str, Any]] = {
    "default": dict(
        dj_database_url.parse(os.environ.get("LOCKKIT_BENCH_DATABASE_URL", ""), conn_max_age=None)
    )
}

# Both implementations ask for the same bound on lock waits: 5 s.
LOCKKIT: dict[str, Any] = {"LOCK_TIMEOUT": 5.0}
