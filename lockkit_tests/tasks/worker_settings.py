"""Settings of ``manage.py lockkit_worker`` processes started by the tasks tests: the suite's, on its test databases.

``LOCKKIT_TASKS_TEST_DATABASES`` (JSON ``{alias: {setting: value}}``) points each alias at the database the parent
uses (its test database's ``NAME``; a throwaway cluster's ``HOST``/``PORT``);
``LOCKKIT_TASKS_TEST_TASKS`` (JSON) replaces ``TASKS``; ``LOCKKIT_TEST_MYSQL_INIT_COMMAND`` is the ``mariadb`` alias's
``init_command`` (a session setting such as ``idle_transaction_timeout``); ``LOCKKIT_TASKS_TEST_NO_LOGGING`` leaves ``LOGGING`` unset.
``SIGUSR1`` writes every thread's stack to the worker's log (``faulthandler``).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal

from lockkit_tests.settings import *  # noqa: F403 (the suite's settings, adjusted below)
from lockkit_tests.settings import DATABASES

# A worker that does not exit in time is asked for every thread's stack before it is killed (WorkerProcess.wait).
faulthandler.register(signal.SIGUSR1, all_threads=True)

for _alias, _overrides in json.loads(os.environ.get("LOCKKIT_TASKS_TEST_DATABASES", "{}")).items():
    DATABASES[_alias] = {**DATABASES[_alias], **_overrides, "TEST": {}}
if "mariadb" in DATABASES and os.environ.get("LOCKKIT_TEST_MYSQL_INIT_COMMAND"):
    _init = os.environ["LOCKKIT_TEST_MYSQL_INIT_COMMAND"]
    DATABASES["mariadb"]["OPTIONS"] = {**(DATABASES["mariadb"].get("OPTIONS") or {}), "init_command": _init}
if "LOCKKIT_TASKS_TEST_TASKS" in os.environ:
    TASKS = json.loads(os.environ["LOCKKIT_TASKS_TEST_TASKS"])
if not os.environ.get("LOCKKIT_TASKS_TEST_NO_LOGGING"):
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"console": {"class": "logging.StreamHandler"}},
        "loggers": {"lockkit.tasks": {"level": "INFO", "handlers": ["console"]}},
    }
