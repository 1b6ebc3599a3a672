"""A task row another session holds locked is skipped, not waited for (PostgreSQL and MariaDB: SQLite has no row
locks, one writer holds the whole database). Ported from django-tasks' ``test_worker_with_locked_rows``.
"""

from __future__ import annotations

import logging
import threading

import pytest
from django.db import connections, transaction
from django.tasks import TaskResultStatus

from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, run_worker, vendor_aliases

pytestmark = pytest.mark.parametrize("alias", vendor_aliases()[:2])


def test_worker_with_locked_rows(alias: str, caplog: pytest.LogCaptureFixture) -> None:
    """A task row another session holds locked is skipped (``SKIP LOCKED``), not waited for; nor does the
    worker's heartbeat wait for it (no warning is logged: no lock timeout)."""
    with backend_on(alias) as backend:
        first = jobs.noop_task.enqueue()
        locked = threading.Event()
        release = threading.Event()

        def hold() -> None:
            try:
                with transaction.atomic(using=alias):
                    list(QueuedTask.objects.using(alias).select_for_update().filter(pk=first.id))
                    locked.set()
                    release.wait(20)
            finally:
                connections.close_all()

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert locked.wait(10)
            second = jobs.noop_task.enqueue()
            with caplog.at_level(logging.WARNING, logger="lockkit"):
                assert list(run_worker(backend).ids) == [second.id]
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        finally:
            release.set()
            holder.join(20)
        assert not holder.is_alive()
        first.refresh()
        assert first.status == TaskResultStatus.READY
