"""``@periodic_task``: a schedule declared on the task, found by the workers (task_modules, apps' ``tasks``),
fired once per tick across worker processes, refused when its input is bad or its name taken.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.tasks import task
from django.test import override_settings

from lockkit.tasks import periodic_task
from lockkit.tasks.models import PeriodicSchedule, QueuedTask
from lockkit.tasks.periodic import declared
from lockkit.tasks.worker import Worker
from lockkit_tests.tasks.helpers import APPS, backend_on, wait_for, worker_process
from lockkit_tests.tasks.jobs import noop_task
from lockkit_tests.tasks.test_periodic import VENDORS, assert_each_tick_once, every, stop_all

DECLARED = "lockkit_tests.tasks.declared_jobs.declared_tick"


def _declared_ticks(alias: str) -> list[Any]:
    rows = QueuedTask.objects.using(alias).filter(task_path=DECLARED)
    return sorted(row.run_after for row in rows)


@pytest.fixture
def registry() -> Iterator[None]:
    """The declarations a test makes in this process are forgotten after it (other tests' workers would fire them)."""
    before = {backend: dict(found) for backend, found in declared._declared.items()}
    try:
        yield
    finally:
        declared._declared.clear()
        declared._declared.update(before)


@pytest.mark.parametrize("alias", VENDORS)
def test_two_workers_fire_each_tick_of_a_declared_schedule_once(alias: str) -> None:
    options = {"task_modules": ["lockkit_tests.tasks.declared_jobs"]}
    with ExitStack() as stack:
        workers = [stack.enter_context(worker_process(alias, options=options)) for _ in range(2)]
        wait_for(lambda: len(_declared_ticks(alias)) >= 3, timeout=60, what="three declared ticks")
        wait_for(
            lambda: QueuedTask.objects.using(alias).filter(task_path=DECLARED, status="SUCCESSFUL").exists(),
            timeout=30,
            what="a declared tick run",
        )
        stop_all(workers)
        logs = [worker.log() for worker in workers]
    ticks = _declared_ticks(alias)
    assert_each_tick_once(ticks, 2)
    row = PeriodicSchedule.objects.using(alias).get()
    assert (row.name, row.task_path, row.last_action) == ("declared-tick", DECLARED, "fired")
    assert row.last_tick == ticks[-1]
    done = QueuedTask.objects.using(alias).filter(task_path=DECLARED, status="SUCCESSFUL").first()
    assert done is not None
    assert (done.arguments(), done.return_value) == (([], {"source": "decorator"}), "decorator")
    assert all("1 periodic schedule(s)" in log for log in logs), logs


def _spare() -> None:
    return None


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"cron": "61 * * * *"}, ValueError, "['cron']"),
        ({"cron": "* * * * *", "missed": "all"}, ValueError, "['missed']"),
        ({"cron": "* * * * *", "grace": 0}, ValueError, "['grace']"),
        ({"cron": "* * * * *", "args": "xy"}, TypeError, "['args']"),
        ({"cron": "* * * * *", "kwargs": {"a": {1}}}, TypeError, "['kwargs']"),
        ({"cron": "* * * * *", "name": "x" * 101}, ValueError, "name"),
    ],
)
@pytest.mark.usefixtures("registry")
def test_a_bad_declaration_is_refused_at_import_naming_the_argument(
    kwargs: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error) as refused:
        periodic_task(**kwargs)(task()(_spare))
    assert str(refused.value).startswith(f"@periodic_task on {__name__}._spare: ")
    assert named in str(refused.value)
    assert declared._declared.get("default", {}) == {}


@pytest.mark.usefixtures("registry")
def test_it_decorates_a_task_not_a_function_and_a_name_is_one_schedule() -> None:
    with pytest.raises(TypeError, match=r"above @task"):
        periodic_task("* * * * *")(_spare)  # type: ignore[type-var]
    spare = task()(_spare)
    assert periodic_task("* * * * *")(spare) is spare  # the task, unchanged; named by its path
    assert periodic_task("* * * * *")(spare) is spare  # the same declaration again (a module imported twice)
    with pytest.raises(ValueError, match=r"already has a schedule named .*_spare"):
        periodic_task("0 * * * *")(spare)
    assert [s.cron for s in declared._declared["default"].values()] == ["* * * * *"]


@pytest.mark.django_db(transaction=True, available_apps=APPS)
@pytest.mark.usefixtures("registry")
def test_a_declared_schedule_with_a_configured_ones_name_stops_the_worker_and_fails_the_check() -> None:
    periodic_task("*/5 * * * * *", name="tick")(noop_task)
    with backend_on("default", periodic=every(2)) as backend:
        with pytest.raises(ImproperlyConfigured, match=r"\[\"periodic\"\]\['tick'\].*rename one"):
            Worker(backend, queues=["default"])
        errors = [message for message in backend.check() if message.id == "lockkit.tasks.E002"]
        assert len(errors) == 1
        assert "'tick'" in errors[0].msg
    assert not PeriodicSchedule.objects.exists()


@pytest.mark.django_db(transaction=True, available_apps=APPS)
@pytest.mark.usefixtures("registry")
def test_a_declared_schedule_joins_the_configured_ones() -> None:
    periodic_task("0 3 * * *", name="nightly", missed="skip", grace=5)(noop_task)
    with backend_on("default", periodic=every(2)) as backend:
        worker = Worker(backend, queues=["default"])
        assert [(s.name, s.cron, s.missed, s.grace) for s in worker.schedules] == [
            ("tick", "*/2 * * * * *", "once", 60.0),
            ("nightly", "0 3 * * *", "skip", 5.0),
        ]
        assert [m for m in backend.check() if m.id == "lockkit.tasks.E002"] == []


@pytest.mark.usefixtures("registry")
def test_the_decorator_without_its_arguments_is_refused_at_once() -> None:
    spare = task()(_spare)
    with pytest.raises(TypeError, match=r"takes a cron expression first: .* \(got the Task .*\._spare\)"):
        periodic_task(spare)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"takes a cron expression first: .* \(got int 5\)"):
        periodic_task(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"not the function .*\._spare"):
        periodic_task("* * * * *")(_spare)  # type: ignore[type-var]
    assert declared._declared.get("default", {}) == {}


@pytest.mark.django_db(transaction=True, available_apps=APPS)
@pytest.mark.parametrize(
    ("schedule", "named"),
    [
        ({"args": [1]}, "args [1]"),
        ({"kwargs": {"unknown": 1}}, "kwargs {'unknown': 1}"),
    ],
)
def test_arguments_the_task_cannot_take_fail_the_check_and_the_worker(
    schedule: dict[str, Any], named: str
) -> None:
    periodic = {
        "t": {"task": "lockkit_tests.tasks.jobs.calculate_meaning_of_life", "cron": "* * * * *", **schedule}
    }
    with backend_on("default", periodic=periodic) as backend:
        found = [m for m in backend.check() if m.id == "lockkit.tasks.E002"]
        errors = [m.msg for m in found]
        assert len(errors) == 1
        assert "cannot be called with the schedule's" in errors[0]
        assert named in errors[0]
        # The hint is about the arguments (a new user's trial: it said to name a Task by its path).
        assert found[0].hint == "Give the schedule the args and kwargs the task's function takes."
        with pytest.raises(ImproperlyConfigured, match="cannot be called"):
            Worker(backend, queues=["default"])
    assert not PeriodicSchedule.objects.exists()


@pytest.mark.django_db(transaction=True, available_apps=APPS)
def test_a_task_module_that_does_not_import_is_named_by_the_check() -> None:
    with backend_on("default", task_modules=["lockkit_tests.tasks.no_such_module"]) as backend:
        errors = [m.msg for m in backend.check() if m.id == "lockkit.tasks.E002"]
    assert len(errors) == 1
    assert errors[0].startswith(
        'TASKS["default"]["OPTIONS"]["task_modules"]: cannot import \'lockkit_tests.tasks.no_such_module\''
    )


def test_a_declaration_under_a_test_backend_warns_and_leaves_the_task_usable() -> None:
    """A project's tests swap TASKS for Django's ImmediateBackend: the module of a ``@periodic_task`` still imports
    (before: ``ValueError`` at import, so none of its tasks could be tested), with a ``RuntimeWarning``."""
    immediate = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    try:
        with override_settings(TASKS=immediate):
            with pytest.warns(
                RuntimeWarning, match=r"backend 'default' \(ImmediateBackend\) is not a lockkit"
            ):
                doubled = periodic_task("*/5 * * * *", name="under-a-test")(task()(_doubled))
            assert doubled.enqueue(21).return_value == 42
            assert "under-a-test" not in declared._declared.get("default", {})
            assert [text for text in declared._ignored if "'under-a-test'" in text]  # for the check's W002
    finally:  # this process's later checks are not about this test's declaration
        declared._ignored[:] = [text for text in declared._ignored if "'under-a-test'" not in text]


def _doubled(value: int) -> int:
    return value * 2
