"""``OPTIONS["id_function"]``, as django-tasks' option: each task's id from it; a bad one refused, nothing written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.postgres.functions import RandomUUID
from django.core.exceptions import ImproperlyConfigured
from django.tasks import task_backends
from django.test import override_settings

from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, run_worker, tasks_setting, vendor_aliases

pytestmark = pytest.mark.parametrize("alias", vendor_aliases())

FIXED = "0b8c2bc6-7a5e-4bfa-9d7b-1e2f3a4b5c6d"


def fixed_text() -> str:
    return FIXED


def not_a_uuid() -> str:
    return "order-17"


def random_uuid_expression() -> Any:
    return RandomUUID()


@pytest.mark.parametrize("id_function", ["uuid.uuid1", uuid.uuid1], ids=["path", "callable"])
def test_each_task_gets_its_id_from_the_function_and_runs(alias: str, id_function: Any) -> None:
    with backend_on(alias, id_function=id_function) as backend:
        results = [jobs.calculate_meaning_of_life.enqueue() for _ in range(3)]
        assert [uuid.UUID(result.id).version for result in results] == [1, 1, 1]
        stored = {str(pk) for pk in QueuedTask.objects.using(alias).values_list("pk", flat=True)}
        assert stored == {result.id for result in results}
        run_worker(backend)
        assert [backend.get_result(r.id).return_value for r in results] == [42, 42, 42]


def test_its_text_of_a_uuid_is_stored_as_the_uuid(alias: str) -> None:
    with backend_on(alias, id_function=f"{__name__}.fixed_text"):
        result = jobs.noop_task.enqueue()
    assert result.id == FIXED
    assert str(QueuedTask.objects.using(alias).get().pk) == FIXED


@pytest.mark.parametrize(
    "made", [f"{__name__}.not_a_uuid", f"{__name__}.random_uuid_expression"], ids=["text", "expression"]
)
def test_an_id_that_is_not_a_uuid_is_refused_before_any_sql(alias: str, made: str) -> None:
    with backend_on(alias, id_function=made):
        with pytest.raises(ImproperlyConfigured, match=r'\["id_function"\] must return a uuid.UUID'):
            jobs.noop_task.enqueue()
    assert QueuedTask.objects.using(alias).count() == 0


@pytest.mark.parametrize(
    ("value", "error", "named"),
    [
        # A setting that names nothing is ImproperlyConfigured, not an ImportError traceback (issue 34).
        ("missing.function", ImproperlyConfigured, "['id_function']: cannot import 'missing.function'"),
        (
            "uuid.NAMESPACE_DNS",
            ImproperlyConfigured,
            "id_function 'uuid.NAMESPACE_DNS' is a UUID, not a callable",
        ),
        (5, ImproperlyConfigured, "id_function must be a callable or its dotted path, not int"),
    ],
)
def test_a_bad_id_function_is_refused_when_the_backend_is_built(
    alias: str, value: Any, error: type[Exception], named: str
) -> None:
    with override_settings(TASKS=tasks_setting(alias, id_function=value)):
        with pytest.raises(error) as refused:
            task_backends["default"]
    assert named in str(refused.value)
    assert QueuedTask.objects.using(alias).count() == 0
