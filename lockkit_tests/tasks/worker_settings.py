"""Settings of ``manage.py lockkit_worker`` processes started by the tasks tests: the suite's, on its test databases.

``LOCKKIT_TASKS_TEST_DATABASES`` (JSON ``{alias: NAME}``) points each alias at the test database the parent made;
``LOCKKIT_TASKS_TEST_TASKS`` (JSON) replaces ``TASKS``.
"""

from __future__ import annotations

import json
import os

from lockkit_tests.settings import *  # noqa: F403 (the suite's settings, adjusted below)
from lockkit_tests.settings import DATABASES

for _alias, _name in json.loads(os.environ.get("LOCKKIT_TASKS_TEST_DATABASES", "{}")).items():
    DATABASES[_alias]["NAME"] = _name
if "LOCKKIT_TASKS_TEST_TASKS" in os.environ:
    TASKS = json.loads(os.environ["LOCKKIT_TASKS_TEST_TASKS"])
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"lockkit.tasks": {"level": "INFO", "handlers": ["console"]}},
}
