"""What one trivial task costs the worker's connection: messages on PostgreSQL, statements on MariaDB (issue 34).

Counted on the worker's own connection (the main thread's: ``--concurrency 1`` runs tasks there) with Django's
``CaptureQueriesContext``, which records each ``execute()`` without an execute wrapper (a wrapper would send the
claims through a scope instead of one message). A PostgreSQL message of several statements is one ``execute()``.
"""

from __future__ import annotations

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, rows, run_worker

TASKS = 20


def _tx(*databases: str) -> pytest.MarkDecorator:
    return pytest.mark.django_db(
        transaction=True,
        databases=list(databases),
        available_apps=["lockkit", "lockkit.tasks", "lockkit_tests"],
    )


def _run(alias: str) -> list[str]:
    """Run ``TASKS`` trivial tasks with one worker (burst, batch 1); the statements its connection sent."""
    with backend_on(alias) as backend:
        for _ in range(TASKS):
            jobs.noop_task.enqueue()
        with CaptureQueriesContext(connections[alias]) as queries:
            stats = run_worker(backend, concurrency=1, batch=1)
        assert stats.succeeded == TASKS
        assert {str(row.status) for row in rows(alias)} == {"SUCCESSFUL"}
        assert all(row.lease_expires_at is None for row in rows(alias))
        return [query["sql"] for query in queries.captured_queries]


@_tx("default")
def test_postgresql_one_message_per_task() -> None:
    """A task's completion travels with the next claim: one message (and one commit) per task, plus the last claim."""
    sent = _run("default")
    assert len(sent) == TASKS + 1, sent
    # Each message after the first completes the previous task and claims the next in one transaction.
    carrying = [text for text in sent if text.count('UPDATE "lockkit_tasks_queuedtask" SET') == 2]
    assert len(carrying) == TASKS, sent
