"""``lockkit.tasks.fenced()`` outside a lockkit worker: Django's ``ImmediateBackend``, as a project's tests use it.

There is no claim to fence: the block is a plain ``lockkit.locked()`` scope on the default database, so a task
written for lockkit's worker runs unchanged there (before, ``fenced()`` raised ``RuntimeError`` and every such
task failed under ``ImmediateBackend``).
"""

from __future__ import annotations

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus
from django.test import override_settings

from lockkit.tasks import current_claim
from lockkit_tests.models import Owner
from lockkit_tests.tasks import jobs

IMMEDIATE = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_fenced_under_the_immediate_backend_commits_with_its_block() -> None:
    with override_settings(TASKS=IMMEDIATE):
        result = jobs.fenced_effect.enqueue("immediate")
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == "immediate"
    assert Owner.objects.filter(name="immediate").count() == 1


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_fenced_under_the_immediate_backend_rolls_back_what_its_block_wrote_when_it_raises() -> None:
    with override_settings(TASKS=IMMEDIATE):
        result = jobs.fenced_effect_then_raise.enqueue("rolled back")
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class_path for error in result.errors] == ["builtins.ValueError"]
    assert not Owner.objects.filter(name="rolled back").exists()


def test_current_claim_outside_a_worker_still_says_there_is_none() -> None:
    with pytest.raises(RuntimeError, match=r"only inside a task run by manage\.py lockkit_worker"):
        current_claim()


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_fenced_under_the_immediate_backend_inside_the_caller_s_atomic_is_a_savepoint_of_it() -> None:
    with override_settings(TASKS=IMMEDIATE):
        with transaction.atomic():
            Owner.objects.create(name="caller")
            failed = jobs.fenced_effect_then_raise.enqueue("inner rolled back")
            done = jobs.fenced_effect.enqueue("inner kept")
            Owner.objects.create(name="caller after")  # the caller's transaction is still usable
        assert (failed.status, done.status) == (TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL)
        assert sorted(Owner.objects.values_list("name", flat=True)) == [
            "caller",
            "caller after",
            "inner kept",
        ]
        with transaction.atomic():
            jobs.fenced_effect.enqueue("rolled back with the caller")
            transaction.set_rollback(True)
        assert not Owner.objects.filter(name="rolled back with the caller").exists()


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_second_or_a_nested_fenced_under_the_immediate_backend_raises_as_under_the_worker() -> None:
    """Under ``ImmediateBackend`` a task is held to the worker's rules, so a project's tests catch the misuse the
    worker refuses (before, a second or a nested block was a plain locked scope and the task passed)."""
    with override_settings(TASKS=IMMEDIATE):
        twice = jobs.fenced_twice.enqueue("twice")
        nested = jobs.nested_fenced.enqueue("nested")
        once = jobs.fenced_effect.enqueue(
            "once"
        )  # each task run its own: the first block of the next one works
    assert (twice.status, nested.status, once.status) == (
        TaskResultStatus.FAILED,
        TaskResultStatus.FAILED,
        TaskResultStatus.SUCCESSFUL,
    )
    assert [e.exception_class_path for e in twice.errors + nested.errors] == ["builtins.RuntimeError"] * 2
    assert "already used" in twice.errors[0].traceback
    assert "already open" in nested.errors[0].traceback
    # The first block committed; the second wrote nothing; the nested pair rolled back with the outer block.
    assert sorted(Owner.objects.values_list("name", flat=True)) == ["once", "twice"]
    # A direct call is not a task run: nothing to hold it to, each block is a plain locked scope.
    assert jobs.fenced_twice.call("called") == "called"
    assert Owner.objects.filter(name__startswith="called").count() == 2
