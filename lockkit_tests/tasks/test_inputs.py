"""What the backend refuses before any SQL: bad tasks, arguments that are not JSON, bad ``OPTIONS``.

No test here may touch a database (pytest-django refuses any query without a ``django_db`` mark), so each one also
shows that the refusal comes before SQL. Ported in part from django-tasks' ``test_database_backend.py``.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTask
from django.test import override_settings
from django.utils import timezone

from lockkit.tasks import DatabaseBackend
from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, tasks_setting, vendor_aliases


def test_a_task_of_another_backend_refused_before_sql() -> None:
    setting = {
        **tasks_setting("default"),
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
    }
    with override_settings(TASKS=setting):
        other = jobs.noop_task.using(backend="immediate")
        with pytest.raises(InvalidTask, match="uses backend 'immediate', not 'default'"):
            task_backends["default"].enqueue(other, [], {})


@pytest.mark.parametrize("priority", [101, -101, 1.5])
def test_priority_range_refused_before_sql(priority: Any) -> None:
    with backend_on("default"):
        with pytest.raises(InvalidTask, match="priority must be a whole number"):
            jobs.noop_task.using(priority=priority).enqueue()


def test_run_after_must_be_aware() -> None:
    with backend_on("default"), pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        jobs.noop_task.using(run_after=datetime.now()).enqueue()


@pytest.mark.parametrize(
    ("run_after", "message"),
    [
        (
            timedelta(seconds=3),
            "not timedelta: for a delay, use task.using(run_after=timezone.now() + timedelta(...))",
        ),
        ("2030-01-01T00:00:00Z", "not str"),
        (1893456000, "not int"),
    ],
)
def test_run_after_that_is_not_a_datetime_is_invalid_task_naming_its_type(
    run_after: Any, message: str
) -> None:
    """Not Django's ``AttributeError: 'datetime.timedelta' object has no attribute 'utcoffset'`` (a new user's)."""
    with backend_on("default"), pytest.raises(InvalidTask, match=re.escape(message)):
        jobs.noop_task.using(run_after=run_after).enqueue()


def test_validate_on_enqueue() -> None:
    with backend_on("default"):
        with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
            jobs.noop_task.using(queue_name="unknown_queue").enqueue()
        with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
            async_to_sync(jobs.noop_task.using(queue_name="unknown_queue").aenqueue)()


def nested(depth: int) -> Any:
    """``depth`` lists, one inside the other, around an int."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def cycle() -> list[Any]:
    looped: list[Any] = []
    looped.append(looped)
    return looped


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("lone \ud800 surrogate",), {}, r"args must be valid Unicode text: a lone surrogate '\\ud800'"),
        ((), {"key": {"deep": "\udfff"}}, "kwargs must be valid Unicode text"),
        ((nested(30),), {}, "args must not nest lists/dicts more than 30 deep"),  # args' own list is one
        ((), {"x": nested(30)}, "kwargs must not nest lists/dicts more than 30 deep"),
        ((nested(100_000),), {}, "args must not nest lists/dicts more than 30 deep"),  # not a RecursionError
        ((cycle(),), {}, "args must not nest lists/dicts more than 30 deep"),
    ],
)
def test_arguments_the_databases_refuse_are_refused_before_sql(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with backend_on("default"), pytest.raises(ValueError, match=message):
        jobs.echo.enqueue(*args, **kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((object(),), {}, TypeError, "args is not JSON serializable: Unsupported type"),
        ((), {"when": timezone.now()}, TypeError, "kwargs is not JSON serializable"),
        ((float("nan"),), {}, ValueError, "NaN or infinity"),
        ((float("inf"),), {}, ValueError, "NaN or infinity"),
        (({1: "int key"},), {}, TypeError, "dict keys must be strings"),
        (("nul \x00 char",), {}, ValueError, "NUL characters"),
        ((), {"a\x00": 1}, ValueError, "NUL characters"),  # in a key
        (("\\\x00",), {}, ValueError, "NUL characters"),  # after a backslash
        ((b"\xff\xfe",), {}, ValueError, "args is not JSON serializable: Unsupported value"),
        (({1, 2},), {}, TypeError, "Unsupported type"),
    ],
)
def test_arguments_refused_before_sql(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with backend_on("default"):
        with pytest.raises(error, match=message):
            jobs.echo.enqueue(*args, **kwargs)


@pytest.mark.parametrize("alias", vendor_aliases(apps=APPS))
def test_a_backslash_before_u0000_is_text_not_a_nul(alias: str) -> None:
    """``"C:\\u0000"`` holds no NUL: enqueued and read back as written on every vendor (refused before)."""
    written = ["C:\\u0000", {"\\u0000": "\\\\u0000"}]
    with backend_on(alias):
        result = jobs.echo.enqueue(*written)
        assert QueuedTask.objects.using(alias).get(pk=result.id).args_kwargs["args"] == written


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lease": 0}, r'TASKS\["default"\]\["OPTIONS"\]: lease must be a positive number of seconds'),
        ({"lease": 0.5}, "lease must be at least 1 second"),
        ({"lease": "30"}, "lease must be seconds"),
        ({"max_attempts": 0}, "max_attempts must be at least 1"),
        ({"max_attempts": True}, "max_attempts must be an int"),
        ({"retry_backoff": float("nan")}, "retry_backoff must be a finite number"),
        ({"poll_interval": -1}, "poll_interval must be a positive number"),
        ({"notify": "yes"}, "notify must be True or False"),
        ({"database": ""}, "database must be a database alias"),
        (
            {"leese": 30},
            r"unknown option\(s\) 'leese' \('leese': did you mean 'lease'\?\); known: database, lease",
        ),
        ({"LEASE": 30}, r"unknown option\(s\) 'LEASE' \('LEASE': did you mean 'lease'\?\); known"),
        ({("lease",): 30}, r"unknown option\(s\) \('lease',\); known"),
        ({"x" * 200_000: 30}, r"unknown option\(s\) 'x{56}\.\.\.; known"),
        (
            {"database": "nowhere"},
            r"database must be an alias of settings.DATABASES \('default', .*got 'nowhere'",
        ),
    ],
)
def test_options_checked(options: dict[str, Any], message: str) -> None:
    setting = tasks_setting("default")
    setting["default"]["OPTIONS"].update(options)
    with pytest.raises(ImproperlyConfigured, match=message):
        DatabaseBackend("default", setting["default"])


def test_options_must_be_a_dict() -> None:
    with pytest.raises(ImproperlyConfigured, match=r'TASKS\["x"\]\["OPTIONS"\] must be a dict, not list'):
        DatabaseBackend("x", {"OPTIONS": []})


def test_an_alias_or_queue_longer_than_its_column_is_refused_before_sql() -> None:
    """``backend_name`` and ``queue_name`` are 32 characters: longer was a ``DataError`` at each enqueue (after SQL),
    and a periodic schedule of such a backend failed every second, for good, without firing."""
    long = "b" * 33
    setting = {long: {"BACKEND": "lockkit.tasks.DatabaseBackend", "QUEUES": []}}
    with override_settings(TASKS=setting), pytest.raises(ImproperlyConfigured, match="at most 32 characters"):
        task_backends[long]  # built on first use
    setting = {"default": {"BACKEND": "lockkit.tasks.DatabaseBackend", "QUEUES": ["default", "q" * 33]}}
    with override_settings(TASKS=setting), pytest.raises(ImproperlyConfigured, match="at most 32 characters"):
        task_backends["default"]
    setting = {"default": {"BACKEND": "lockkit.tasks.DatabaseBackend", "QUEUES": []}}  # any queue
    with override_settings(TASKS=setting):
        with pytest.raises(InvalidTask, match=r"queue_name .* at most 32 characters"):
            jobs.noop_task.using(queue_name="q" * 33).enqueue()
