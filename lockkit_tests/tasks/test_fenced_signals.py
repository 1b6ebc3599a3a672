"""Django's ``task_started``/``task_finished`` for tasks that use ``lockkit.tasks.fenced()``, in every worker mode.

The success of a ``fenced()`` task is written with its block; ``task_finished`` is sent once, after that, with the
result as written (its value once recorded), whatever the worker's mode: one task at a time (on PostgreSQL a
plain task's success travels with the next claim), successes completed in batches (``--claim-batch``), several
runners (``--concurrency``). Before, it was never sent for them: a receiver saw them start and never finish.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished, task_started

from lockkit.tasks.errors import ReturnValueNotRecorded
from lockkit.tasks.models import QueuedTask
from lockkit_tests.models import Owner
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, run_worker, vendor_aliases

ALL = vendor_aliases(apps=APPS)

#: The worker's modes: one task at a time (handover on PostgreSQL), batched successes, several runners.
MODES = [
    pytest.param({"concurrency": 1, "batch": 1}, id="one"),
    pytest.param({"concurrency": 1, "batch": 4}, id="claim-batch"),
    pytest.param({"concurrency": 3}, id="concurrency"),
]


@contextmanager
def _signals_seen(alias: str, raise_for: str | None = None) -> Iterator[list[tuple[str, str, Any]]]:
    """Receivers of ``task_started`` and ``task_finished`` for the block: ``(signal, id, status in the database)``.

    ``raise_for``: a task path whose ``task_finished`` receiver raises (after recording it).
    """
    seen: list[tuple[str, str, Any]] = []

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("started", task_result.id, None))

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        written = QueuedTask.objects.using(alias).values_list("status", flat=True).get(pk=task_result.id)
        seen.append(("finished", task_result.id, (written, task_result)))
        if task_result.task.module_path == raise_for:
            raise RuntimeError("a task_finished receiver failed on purpose")

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        yield seen
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("alias", ALL)
def test_task_finished_is_sent_once_for_a_fenced_task_after_its_success_is_written(
    alias: str, mode: dict[str, int]
) -> None:
    with backend_on(alias, max_attempts=1) as backend, _signals_seen(alias) as seen:
        fenced = [jobs.fenced_effect.enqueue(f"fenced-{n}") for n in range(3)]
        plain = jobs.calculate_meaning_of_life.enqueue()
        raising = jobs.fenced_then_raise.enqueue("raising")
        everything: list[Any] = [*fenced, plain, raising]
        stats = run_worker(backend, **mode)
        ids = {result.id for result in everything}
        started = Counter(task_id for name, task_id, _ in seen if name == "started")
        finished = Counter(task_id for name, task_id, _ in seen if name == "finished")
        assert started == dict.fromkeys(ids, 1)
        assert finished == dict.fromkeys(ids, 1), f"task_finished not sent once each: {finished} of {ids}"
        sent = {task_id: value for name, task_id, value in seen if name == "finished"}
        for result in everything:
            written, sent_result = sent[result.id]
            assert written == TaskResultStatus.SUCCESSFUL  # sent after the success was written
            assert sent_result.status == TaskResultStatus.SUCCESSFUL
            assert sent_result.finished_at is not None
            order = [(name, task_id) for name, task_id, _ in seen]
            assert order.index(("started", result.id)) < order.index(("finished", result.id))
        for n, result in enumerate(fenced):
            assert sent[result.id][1].return_value == f"fenced-{n}"  # the value, recorded before the signal
        with pytest.raises(ReturnValueNotRecorded):
            _ = sent[raising.id][1].return_value
        assert sent[plain.id][1].return_value == 42
        assert stats.succeeded == 5
        assert stats.failed == stats.lost == 0
        assert sorted(stats.ids) == sorted(str(result.id) for result in everything)
        assert Owner.objects.using(alias).filter(name__startswith="fenced-").count() == 3


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("alias", ALL)
def test_a_task_finished_receiver_raising_for_a_fenced_task_does_not_stop_the_worker(
    alias: str, mode: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    with (
        backend_on(alias, max_attempts=1) as backend,
        _signals_seen(alias, raise_for=jobs.fenced_effect.module_path) as seen,
        caplog.at_level(logging.ERROR, logger="lockkit.tasks.worker"),
    ):
        results = [jobs.fenced_effect.enqueue(f"bombed-{n}") for n in range(4)]
        every: list[Any] = [*results, jobs.calculate_meaning_of_life.enqueue()]
        stats = run_worker(backend, **mode)
        assert stats.succeeded == 5
        finished = Counter(task_id for name, task_id, _ in seen if name == "finished")
        assert finished == dict.fromkeys([r.id for r in every], 1)
        for result in every:
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL
        logged = [r for r in caplog.records if r.getMessage().endswith(": a task_finished receiver failed")]
        assert len(logged) == 4
        assert not QueuedTask.objects.using(alias).filter(lease_expires_at__isnull=False).exists()
