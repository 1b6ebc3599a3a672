"""Django settings for lockkit's test suite.

``default`` and ``other`` are two databases on the same PostgreSQL server (the URL from ``LOCKKIT_TEST_DATABASE_URL``,
or an embedded server started for the run), so the multi-database tests see two real aliases.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

import dj_database_url

from lockkit_tests import topology
from lockkit_tests.dbserver import database_url

SECRET_KEY = "lockkit-tests-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
# The sample project's apps too: its tests run in the same pytest session (one command for the whole suite).
INSTALLED_APPS = [
    "lockkit",
    "lockkit_tests",
    "sample_project.inventory",
    "sample_project.jobs",
    "sample_project.soak",
]
ROOT_URLCONF = "lockkit_tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_default: dict[str, Any] = dict(dj_database_url.parse(database_url(), conn_max_age=0))
_other: dict[str, Any] = {**_default, "NAME": f"{_default['NAME']}_other"}

# A second connection to the default database that runs SERIALIZABLE transactions, for serialization failures.
_serializable: dict[str, Any] = {
    **_default,
    "OPTIONS": {**_default.get("OPTIONS", {}), "options": "-c default_transaction_isolation=serializable"},
    "TEST": {"MIRROR": "default"},
}

DATABASES: dict[str, dict[str, Any]] = {"default": _default, "other": _other, "serializable": _serializable}

# MariaDB/MySQL tests run only when this URL is set (e.g. mysql://root@127.0.0.1:3306/lockkit); they are skipped
# with a visible reason otherwise. Needs mysqlclient (the `mysql` extra).
MYSQL_URL = os.environ.get("LOCKKIT_TEST_MYSQL_URL", "").strip()
if MYSQL_URL:
    DATABASES["mariadb"] = dict(dj_database_url.parse(MYSQL_URL, conn_max_age=0))
# SQLite tests: a file database (never :memory:, which other threads cannot share), in a directory of this run
# that conftest.py creates before the test databases and removes after them (importing settings creates nothing).
_SQLITE_DIR = os.path.join(tempfile.gettempdir(), f"lockkit-sqlite-{os.getpid()}-{uuid.uuid4().hex[:8]}")
DATABASES["sqlite"] = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": os.path.join(_SQLITE_DIR, "lockkit.sqlite3"),
    "TEST": {"NAME": os.path.join(_SQLITE_DIR, "test_lockkit.sqlite3")},
    "OPTIONS": {"timeout": 5},
}
# Fault tests (test_faults_*.py): aliases they point at a cutting proxy, a throwaway cluster they restart, or a
# PgBouncer they start, at run time (lockkit_tests/faultkit.py). Mirrors: Django creates no database for them.
for _fault_alias in ("proxied", "restartable", "bouncer"):
    DATABASES[_fault_alias] = {**_default, "TEST": {"MIRROR": "default"}}
if MYSQL_URL:
    DATABASES["proxied_mariadb"] = {**DATABASES["mariadb"], "TEST": {"MIRROR": "mariadb"}}
# Topology tests (a primary, its hot standby, PgBouncer in front of the primary): servers started by the tests
# themselves (lockkit_tests/topology.py) when a collected test uses these aliases; absent without the binaries.
DATABASES.update(topology.database_settings())
DATABASE_ROUTERS = ["lockkit_tests.routers.TestRouter"]
# The names before pytest-django switches each alias it sets up to its test database (conftest.py compares).
ORIGINAL_DB_NAMES: dict[str, str] = {alias: str(db["NAME"]) for alias, db in DATABASES.items()}

LOCKKIT: dict[str, Any] = {}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"lockkit": {"level": "DEBUG", "propagate": True}},
}
