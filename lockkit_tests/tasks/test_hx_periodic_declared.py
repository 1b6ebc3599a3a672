"""Hostile tests of ``@periodic_task`` (h-hostile-37): declarations found by worker and ``check`` processes.

Every declaration lives in ``lockkit_tests/tasks/hx_decl/`` and is imported only by the processes these tests start
(``task_modules``), never by the test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from django.db import connections

from lockkit.tasks.models import QueuedTask
from lockkit_tests.support.vendors import MYSQL_CONFIGURED
from lockkit_tests.tasks.helpers import APPS, ROOT, tasks_setting, wait_for, worker_process
from lockkit_tests.tasks.test_periodic import VENDORS, stop_all

GOOD = "lockkit_tests.tasks.hx_decl.good"
GOOD_TASK = f"{GOOD}.good_tick"


def _env(tasks: dict[str, Any]) -> dict[str, str]:
    keys = ("NAME", "HOST", "PORT", "USER", "OPTIONS")
    aliases = ["default", "sqlite", *(["mariadb"] if MYSQL_CONFIGURED else [])]
    names = {a: {k: connections[a].settings_dict.get(k) for k in keys} for a in aliases}
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "lockkit_tests.tasks.worker_settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "LOCKKIT_TASKS_TEST_DATABASES": json.dumps(names),
        "LOCKKIT_TASKS_TEST_TASKS": json.dumps(tasks),
        "LOCKKIT_TASKS_TEST_NO_LOGGING": "1",
    }


def _manage(tasks: dict[str, Any], *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=_env(tasks),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


# --- 1. one schedule whose name the database cannot store stops every schedule of the backend -----------------


@pytest.mark.parametrize("alias", VENDORS)
def test_control_the_good_declaration_alone_fires(alias: str) -> None:
    with worker_process(alias, options={"task_modules": [GOOD]}) as worker:
        wait_for(
            lambda: QueuedTask.objects.using(alias).filter(task_path=GOOD_TASK).exists(),
            timeout=15,
            what="a tick of hx-good",
        )
        stop_all([worker])


# Before the fix (h-hostile-37): a declaration named "hx\x00nul" (PostgreSQL) or "hx\ud800" (PostgreSQL, MariaDB)
# in a module of task_modules passed its import and `manage.py check`; the worker then failed the one bulk INSERT of
# every schedule's row at each loop ("PostgreSQL text fields cannot contain NUL (0x00) bytes; trying again", or a
# UnicodeEncodeError traceback), every second, and hx-good, declared next to it, never fired: 0 ticks in 8 s.


@pytest.mark.parametrize("name", ["hx\x00nul", "hx\ud800"], ids=["nul", "lone-surrogate"])
def test_a_name_no_database_stores_is_refused_by_the_decorator(name: str) -> None:
    from django.tasks import task

    from lockkit.tasks import periodic_task
    from lockkit.tasks.periodic import declared

    before = {backend: dict(found) for backend, found in declared._declared.items()}
    try:
        with pytest.raises(ValueError, match="NUL character or a lone surrogate"):
            periodic_task("* * * * *", name=name)(task()(_spare))
    finally:
        declared._declared.clear()
        declared._declared.update(before)


@pytest.mark.parametrize("name", ["hx\x00nul", "hx\ud800"], ids=["nul", "lone-surrogate"])
def test_a_name_no_database_stores_is_refused_in_the_option(name: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from lockkit_tests.tasks.helpers import backend_on

    schedule = {"task": "lockkit_tests.tasks.jobs.noop_task", "cron": "* * * * *"}
    with pytest.raises(ImproperlyConfigured, match="NUL character or a lone surrogate"):
        with backend_on("default", periodic={name: schedule}):
            pass


# --- 2. what check and the worker say about declarations that clash or modules that fail --------------------------

#: Modules of declarations that clash, declare a bad cron, or fail to import.
BAD_MODULES = [
    pytest.param(
        ["lockkit_tests.tasks.hx_decl.clash_a", "lockkit_tests.tasks.hx_decl.clash_b"],
        id="two-declarations-one-name",
    ),
    pytest.param(["lockkit_tests.tasks.hx_decl.bad_cron"], id="bad-cron-in-a-declaration"),
    pytest.param(["lockkit_tests.tasks.hx_decl.broken_import"], id="module-fails-to-import"),
]


@pytest.mark.django_db(transaction=True, databases=["default"], available_apps=APPS)
@pytest.mark.parametrize("modules", BAD_MODULES)
def test_check_reports_a_bad_declaration_module_as_E002(modules: list[str]) -> None:
    # docs/tasks.md: a declaration with the name of another declaration is refused "lockkit.tasks.E002 from the
    # check"; schedules.check(): "two schedules of one name, or a module of declarations that fails to import, are
    # one E002".
    code, output = _manage(tasks_setting("default", task_modules=modules), "check")
    print(output)
    assert "Traceback" not in output, output
    assert "lockkit.tasks.E002" in output, output
    assert code == 1, output


@pytest.mark.django_db(transaction=True, databases=["default"], available_apps=APPS)
@pytest.mark.parametrize("modules", BAD_MODULES)
def test_the_worker_refuses_to_start_with_a_message_not_a_traceback(modules: list[str]) -> None:
    code, output = _manage(tasks_setting("default", task_modules=modules), "lockkit_worker", "--burst")
    print(output)
    assert code == 1, output
    assert "Traceback" not in output, output


# --- 3. a declaration on a task of another (non-lockkit) backend -------------------------------------------------


@pytest.mark.django_db(transaction=True, databases=["default"], available_apps=APPS)
def test_a_declaration_on_a_task_of_a_backend_no_worker_runs_is_reported() -> None:
    tasks = tasks_setting("default", task_modules=["lockkit_tests.tasks.hx_decl.other_backend"])
    tasks["imm"] = {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}
    _code, output = _manage(tasks, "check")
    print(output)
    # Observed: "System check identified no issues": the schedule hx-imm is recorded under backend 'imm' (not a
    # lockkit backend), which nothing ever fires. Expected: an error or a warning naming it.
    assert "hx-imm" in output, output


# --- 4. argument checks: the message names the argument ---------------------------------------------------------


def _spare() -> None:
    return None


@pytest.mark.parametrize("args", [5, None])
def test_args_that_are_not_iterable_are_refused_naming_the_argument(args: Any) -> None:
    from django.tasks import task

    from lockkit.tasks import periodic_task
    from lockkit.tasks.periodic import declared

    before = {backend: dict(found) for backend, found in declared._declared.items()}
    try:
        with pytest.raises(TypeError) as refused:
            periodic_task("* * * * *", args=args)(task()(_spare))
    finally:
        declared._declared.clear()
        declared._declared.update(before)
    # docstring: "TypeError: ... an argument has a wrong type (the message names it)"
    assert "['args']" in str(refused.value), str(refused.value)
