"""The suite's settings with a lockkit.tasks backend in ``TASKS`` but without its app (``lockkit.tasks.E001``)."""

from __future__ import annotations

from lockkit_tests.settings import *  # noqa: F403 (the suite's settings, adjusted below)
from lockkit_tests.settings import INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "lockkit.tasks"]
