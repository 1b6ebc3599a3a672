"""A lockkit.tasks backend in ``TASKS`` without ``"lockkit.tasks"`` in ``INSTALLED_APPS`` (``"lockkit"`` only).

Found by a newcomer's run: ``manage.py check`` said nothing (nothing had imported django.tasks, which registers
Django's check of the backends), and ``enqueue()`` failed with a raw "relation does not exist".
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.no_app_settings import INSTALLED_APPS

PROBE = """
import django
django.setup()
from django.core import checks
found = [c for c in checks.registry.registry.get_checks() if c.__module__ == "django.tasks.checks"]
print(sorted(m.id for check in found for m in check(None) if m.id and m.id.startswith("lockkit.tasks.")))
"""


def test_the_check_reports_e001_though_nothing_imported_django_tasks() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "lockkit_tests.tasks.no_app_settings"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['lockkit.tasks.E001']", done.stderr


def test_enqueue_and_get_result_refuse_before_any_sql() -> None:
    # No database access is allowed in this test: a query would fail it with pytest-django's own error.
    with override_settings(INSTALLED_APPS=INSTALLED_APPS):
        with pytest.raises(ImproperlyConfigured, match=r'"lockkit.tasks" is not in INSTALLED_APPS'):
            jobs.noop_task.enqueue()
        with pytest.raises(ImproperlyConfigured, match=r'"lockkit.tasks" is not in INSTALLED_APPS'):
            jobs.noop_task.get_backend().get_result("0b8c2bc6-7a5e-4bfa-9d7b-1e2f3a4b5c6d")
