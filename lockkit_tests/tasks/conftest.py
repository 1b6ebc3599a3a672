"""lockkit.tasks needs Django 6 (django.tasks): on older Django only the test of its import error is collected.

Collection is decided here, by Django's version, rather than by skip marks: CI fails a run in which a test is
skipped while every server is available, and the Python 3.11 jobs run Django 5.2.
"""

from __future__ import annotations

from pathlib import Path

import django

if django.VERSION >= (6, 0):
    collect_ignore = ["test_requires_django6.py"]
else:

    def pytest_ignore_collect(collection_path: Path) -> bool | None:
        """On Django < 6, of this directory's tests only ``test_requires_django6.py`` is collected."""
        name = collection_path.name
        if name.startswith("test_") and name != "test_requires_django6.py":
            return True
        return None
