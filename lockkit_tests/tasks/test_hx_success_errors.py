"""Hostile tests of commit 92938de's ``finish()``: a success leaves ``errors`` alone only when it is already ``[]``.

Whatever path writes the success (one UPDATE, the handover with the next claim, a batch of successes), a row ends
with the earlier attempts' errors kept, and a hand-edited non-list ``errors`` ends as a list."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connections
from django.tasks.base import TaskResultStatus

from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, run_worker, vendor_aliases, wait_for

pytestmark = pytest.mark.parametrize("alias", vendor_aliases())

#: (concurrency, batch): 1/1 writes a success with the next claim (handover), 2/4 batches successes, 2/1 one by one.
PATHS = [pytest.param(1, 1, id="handover"), pytest.param(2, 4, id="batched"), pytest.param(2, 1, id="single")]


def _set_errors_text(alias: str, pk: Any, text: str) -> None:
    """Write ``errors`` as raw JSON text, as a hand edit would (``null`` cannot pass through the ORM)."""
    connection = connections[alias]
    table = connection.ops.quote_name(QueuedTask._meta.db_table)
    column = connection.ops.quote_name("errors")
    key = connection.ops.quote_name("id")
    pk_value = QueuedTask._meta.pk.get_db_prep_value(uuid.UUID(str(pk)), connection)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE {key} = %s", [text, pk_value])
        assert cursor.rowcount == 1


@pytest.mark.parametrize(("concurrency", "batch"), PATHS)
def test_successes_keep_earlier_errors_and_make_hand_edits_a_list(
    alias: str, concurrency: int, batch: int
) -> None:
    with backend_on(alias, max_attempts=3) as backend:
        retried = jobs.fail_until.enqueue(succeed_on=3)
        plain = [jobs.echo.enqueue(n) for n in range(3)]
        edited = {text: jobs.echo.enqueue(text) for text in ("{}", "null", '""', "0", "false")}
        for text, result in edited.items():
            _set_errors_text(alias, result.id, text)
        succeeded = failed = 0

        def drained() -> bool:  # a burst worker may stop while the retry waits out its backoff: run another
            nonlocal succeeded, failed
            stats = run_worker(backend, concurrency=concurrency, batch=batch)
            succeeded, failed = succeeded + stats.succeeded, failed + stats.failed
            return not QueuedTask.objects.using(alias).exclude(status=TaskResultStatus.SUCCESSFUL).exists()

        wait_for(drained, timeout=30, what="every task ended")
        assert (succeeded, failed) == (9, 0)
        by_id = {str(row.pk): row for row in QueuedTask.objects.using(alias).all()}

        row = by_id[str(retried.id)]
        assert (row.status, row.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
        assert [(e["attempt"], e["exception_class_path"]) for e in row.errors] == [
            (1, "builtins.RuntimeError"),
            (2, "builtins.RuntimeError"),
        ]
        assert "attempt 2 fails on purpose" in row.errors[1]["traceback"]
        for n, result in enumerate(plain):
            row = by_id[str(result.id)]
            assert (row.status, row.errors, row.return_value) == (
                TaskResultStatus.SUCCESSFUL,
                [],
                {"args": [n], "kwargs": {}},
            )
        for text, result in edited.items():
            row = by_id[str(result.id)]
            assert (text, row.status, row.errors, row.return_value) == (
                text,
                TaskResultStatus.SUCCESSFUL,
                [],
                {"args": [text], "kwargs": {}},
            )
