"""lockkit.tasks needs Django 6 (django.tasks): on older Django only the test of its import error is collected.

Collection is decided here, by Django's version, rather than by skip marks: CI fails a run in which a test is
skipped while every server is available, and the Python 3.11 jobs run Django 5.2. The run's summary says so in one
line (``pytest_terminal_summary``), so that a reader of a Django 5.2 run knows the tasks suite did not run.
"""

from __future__ import annotations

from pathlib import Path

import django
import pytest

if django.VERSION >= (6, 0):
    collect_ignore = ["test_requires_django6.py"]
else:
    _LEFT_OUT = pytest.StashKey[set[str]]()

    def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
        """On Django < 6, of this directory's tests only ``test_requires_django6.py`` is collected."""
        name = collection_path.name
        if name.startswith("test_") and name != "test_requires_django6.py":
            config.stash.setdefault(_LEFT_OUT, set()).add(name)
            return True
        return None

    def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
        """Say in one line how many test modules were left out, and why."""
        left_out = config.stash.get(_LEFT_OUT, set())
        if left_out:
            terminalreporter.write_line(
                f"lockkit_tests/tasks: {len(left_out)} test modules not collected: lockkit.tasks needs "
                f"django.tasks (Django 6.0 or later); this is Django {django.get_version()}"
            )
