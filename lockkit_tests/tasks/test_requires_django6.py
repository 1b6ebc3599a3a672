"""On Django < 6 (no django.tasks), importing lockkit.tasks fails at once with a message saying what to do."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import django
import pytest
from django.core.exceptions import ImproperlyConfigured


def test_import_on_django_before_6_raises_improperly_configured() -> None:
    assert django.VERSION < (6, 0)
    sys.modules.pop("lockkit.tasks", None)
    with pytest.raises(
        ImproperlyConfigured, match=r"lockkit.tasks needs Django 6.0 or later .*this is Django 5"
    ):
        importlib.import_module("lockkit.tasks")
    assert "lockkit.tasks" not in sys.modules


def test_the_run_says_in_one_line_that_the_tasks_suite_was_left_out() -> None:
    # A collection-only run of this directory: its summary says what was left out and why, in one line.
    root = Path(__file__).resolve().parents[2]
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--collect-only",
        "lockkit_tests/tasks",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if "lockkit_tests/tasks" in line and "Django 6" in line]
    modules = len([path for path in (root / "lockkit_tests" / "tasks").glob("test_*.py")]) - 1
    assert said == [
        f"lockkit_tests/tasks: {modules} test modules not collected: lockkit.tasks needs django.tasks "
        f"(Django 6.0 or later); this is Django {django.get_version()}"
    ], done.stdout
    # The next run, of the one module still collected, works.
    assert "test_import_on_django_before_6_raises_improperly_configured" in done.stdout
