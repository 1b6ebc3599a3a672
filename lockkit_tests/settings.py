"""Django settings for lockkit's test suite.

``default`` and ``other`` are two databases on the same PostgreSQL server, so the multi-database tests see two real
aliases. The URL comes from ``LOCKKIT_TEST_DATABASE_URL``, which the pytest plugin ``lockkit_tests.dbserver`` sets
(starting an embedded server) before pytest-django imports this module when it is unset. Importing these settings
starts nothing: imported outside pytest without the variable (mypy's Django plugin reads the installed apps), they
define only an empty ``default`` alias (Django's dummy backend), which refuses any query with
``ImproperlyConfigured``.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

import dj_database_url
import django

from lockkit_tests.support import topology

DATABASE_URL_ENV = "LOCKKIT_TEST_DATABASE_URL"

SECRET_KEY = "lockkit-tests-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
# The sample project's apps too: its tests run in the same pytest session (one command for the whole suite).
INSTALLED_APPS = [
    "lockkit",
    "lockkit_tests",
    "sample_project.inventory",
    "sample_project.jobs",
    "lockkit_harness.soak",
]
# lockkit.tasks is a Django 6 app (django.tasks): on Django 5.2 importing it raises ImproperlyConfigured, and its
# tests are not collected (lockkit_tests/conftest.py).
if django.VERSION >= (6, 0):
    INSTALLED_APPS.append("lockkit.tasks")
    # The tasks admin, tested through the test client with real users (lockkit_tests/tasks/test_admin.py).
    INSTALLED_APPS += [
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
    ]
    MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
    TEMPLATES = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ]
    TASKS: dict[str, dict[str, Any]] = {
        "default": {
            "BACKEND": "lockkit.tasks.DatabaseBackend",
            "QUEUES": ["default", "queue-1"],
            "OPTIONS": {
                "lease": 5,
                "max_attempts": 3,
                "retry_backoff": 0.01,
                "poll_interval": 0.2,
                # The sample project's demo task (sample_project/tests/test_tasks_queue.py) is in no installed app.
                "task_modules": ["sample_project.demo.task_queue"],
            },
        }
    }
# Django REST framework (lockkit.contrib.drf's tests, docs/drf.md): no django.contrib.auth here, so no user model.
REST_FRAMEWORK: dict[str, Any] = {"UNAUTHENTICATED_USER": None}
ROOT_URLCONF = "lockkit_tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES: dict[str, dict[str, Any]] = {"default": {}}
DATABASE_URL = os.environ.get(DATABASE_URL_ENV, "").strip()
if DATABASE_URL:
    _default: dict[str, Any] = dict(dj_database_url.parse(DATABASE_URL, conn_max_age=0))
    DATABASES["default"] = _default
    DATABASES["other"] = {**_default, "NAME": f"{_default['NAME']}_other"}
    # A second connection to the default database that runs SERIALIZABLE transactions, for serialization failures.
    DATABASES["serializable"] = {
        **_default,
        "OPTIONS": {
            **_default.get("OPTIONS", {}),
            "options": "-c default_transaction_isolation=serializable",
        },
        "TEST": {"MIRROR": "default"},
    }

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
# Fault tests (lockkit_tests/faults/): aliases they point at a cutting proxy, a throwaway cluster they restart, or
# a PgBouncer they start, at run time (lockkit_tests/support/faultkit.py). Mirrors: Django creates no database for
# them.
if DATABASE_URL:
    for _fault_alias in ("proxied", "restartable", "bouncer"):
        DATABASES[_fault_alias] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}
if MYSQL_URL:
    DATABASES["proxied_mariadb"] = {**DATABASES["mariadb"], "TEST": {"MIRROR": "mariadb"}}
# Topology tests (a primary, its hot standby, PgBouncer in front of the primary): servers started by the tests
# themselves (lockkit_tests/support/topology.py, through lockkit_harness.cluster) when a collected test uses these
# aliases; absent without the binaries.
DATABASES.update(topology.database_settings())
DATABASE_ROUTERS = ["lockkit_tests.routers.TestRouter"]
# The names before pytest-django switches each alias it sets up to its test database (conftest.py compares).
ORIGINAL_DB_NAMES: dict[str, str] = {alias: str(db.get("NAME", "")) for alias, db in DATABASES.items()}

LOCKKIT: dict[str, Any] = {}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"lockkit": {"level": "DEBUG", "propagate": True}},
}
