"""A row's ``task_path`` is checked before anything is imported: installed apps (or ``task_modules``) only.

A row naming ``unittest.__main__`` once made the worker and ``get_result()`` import it, and its ``SystemExit``
stopped both: the worker now fails the row with ``InvalidTask`` and carries on, ``get_result()`` raises it.
"""

from __future__ import annotations

import json
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.tasks import TaskResultStatus, task
from django.tasks.exceptions import InvalidTask
from django.utils import timezone

from lockkit.tasks.models import QueuedTask
from lockkit.tasks.results import check_task_path
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, run_worker, vendor_aliases, worker_process

ALL = vendor_aliases(apps=APPS)
POSTGRESQL, MARIADB, SQLITE = ALL


def _row(alias: str, path: str) -> QueuedTask:
    return QueuedTask.objects.using(alias).create(
        backend_name="default",
        queue_name="default",
        task_path=path,
        args_kwargs={"args": [], "kwargs": {}},
        enqueued_at=timezone.now(),
    )


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_row_naming_a_main_module_is_failed_and_the_worker_carries_on(alias: str) -> None:
    with backend_on(alias):
        bad = _row(alias, "unittest.__main__.main")
        good = jobs.calculate_meaning_of_life.enqueue()
        with worker_process(alias, "--burst", "--worker-id", "picky") as worker:
            code, output = worker.wait()
        assert code == 0, output
        bad.refresh_from_db()
        assert bad.status == TaskResultStatus.FAILED
        [error] = bad.errors
        assert error["exception_class_path"] == "django.tasks.exceptions.InvalidTask"
        assert "unittest.__main__.main" in error["traceback"]
        assert "__main__" in error["traceback"]
        good.refresh()
        assert good.status == TaskResultStatus.SUCCESSFUL
        assert good.return_value == 42


@pytest.mark.parametrize("alias", ALL)
def test_get_result_refuses_a_path_outside_the_installed_apps_without_importing_it(alias: str) -> None:
    assert "unittest.__main__" not in sys.modules
    with backend_on(alias) as backend:
        main = _row(alias, "unittest.__main__.main")
        outside = _row(alias, "subprocess.check_output")
        try:
            with pytest.raises(InvalidTask, match=r"unittest\.__main__\.main.*__main__"):
                backend.get_result(str(main.id))
        except BaseException as failure:  # SystemExit before the check existed
            raise AssertionError(f"get_result() imported the module: {failure!r}") from None
        assert "unittest.__main__" not in sys.modules
        with pytest.raises(InvalidTask, match=r"subprocess\.check_output.*INSTALLED_APPS"):
            backend.get_result(str(outside.id))
        stats = run_worker(backend)
        assert stats.failed == 2
        assert "unittest.__main__" not in sys.modules
        for row in QueuedTask.objects.using(alias).all():
            assert row.status == TaskResultStatus.FAILED
            assert [e["exception_class_path"] for e in row.errors] == ["django.tasks.exceptions.InvalidTask"]


@pytest.mark.parametrize("alias", ALL)
def test_enqueue_refuses_a_task_outside_the_installed_apps_unless_listed_in_task_modules(alias: str) -> None:
    with backend_on(alias, task_modules=["json"]) as backend:
        outside = task()(json.dumps)  # Django validates a task when it is made, and at each enqueue
        result = outside.enqueue([1])
        assert QueuedTask.objects.using(alias).get().task_path == "json.dumps"
        # Listed, so imported when read back: json.dumps is no Task.
        with pytest.raises(SuspiciousOperation, match="does not point to a Task"):
            backend.get_result(result.id)
        QueuedTask.objects.using(alias).all().delete()
    with backend_on(alias):
        with pytest.raises(InvalidTask, match=r"json\.dumps.*task_modules"):
            outside.enqueue([1])
        assert not QueuedTask.objects.using(alias).exists()  # refused before any SQL
        with pytest.raises(InvalidTask, match=r"json\.dumps.*task_modules"):
            task()(json.dumps)


def test_check_task_path_rules() -> None:
    check_task_path("lockkit_tests.tasks.jobs.echo")  # under an installed app
    check_task_path("json.dumps", ["json"])
    check_task_path("jsonx.y", ["jsonx"])
    for path in (
        "unittest.__main__.main",
        "lockkit_tests.__main__.x",
        "lockkit_tests.tasks.jobs.<locals>.f",
        "x",
    ):
        with pytest.raises(InvalidTask):
            check_task_path(path, ["unittest", "x"])
    with pytest.raises(InvalidTask, match="INSTALLED_APPS"):
        check_task_path("jsonx.dumps", ["json"])  # a prefix is a whole module name, never a string prefix


def test_a_task_outside_the_installed_apps_is_refused_saying_what_to_do() -> None:
    # A new user's trial: a task in the project package (shopsite/jobs.py, not an app) was refused naming the
    # option, not the module to list in it.
    with pytest.raises(InvalidTask) as refused:
        check_task_path("shopsite.jobs.hello")
    assert str(refused.value).endswith(
        "Move the task into an installed app's module, or add 'shopsite.jobs' to the backend's "
        "OPTIONS['task_modules']"
    )


@pytest.mark.parametrize("value", ["json", [1], [""], ["a b"]])
def test_task_modules_option_is_checked(value: object) -> None:
    with pytest.raises(ImproperlyConfigured, match="task_modules"), backend_on("sqlite", task_modules=value):
        pass
