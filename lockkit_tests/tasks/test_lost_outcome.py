"""An outcome the database lost after the worker saw it commit: the task runs again, it is not renewed forever.

A failover to an asynchronous standby, or a crash of a server with ``synchronous_commit = off``, can lose a commit
the client was told succeeded: the task's row is back as the claim left it (``RUNNING``, claimed by the worker,
its token). Found by an acceptance trial: an ``immediate`` restart of such a server under two workers left two
tasks ``RUNNING`` for as long as the workers ran, their heartbeat renewing the claims. Here the lost commit is
written back as the database would present it, under a real worker on every vendor.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.tasks import TaskResultStatus

from lockkit.claims.sql import claims_sql_for
from lockkit.tasks.models import QueuedTask
from lockkit.tasks.worker import Stats, Worker
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, vendor_aliases, wait_for


@pytest.mark.parametrize("alias", vendor_aliases())
def test_a_completion_the_database_lost_is_given_back_and_run_again(alias: str) -> None:
    with backend_on(alias, lease=1, max_attempts=3) as backend:
        result = jobs.calculate_meaning_of_life.enqueue()
        worker = Worker(backend, queues=sorted(backend.queues), worker_id="w")
        outcome: list[Stats | BaseException] = []

        def run() -> None:
            try:
                outcome.append(worker.run())
            except BaseException as failure:  # re-raised by the test
                outcome.append(failure)
            finally:
                connections.close_all()

        thread = threading.Thread(target=run)
        thread.start()
        try:
            wait_for(lambda: worker.stats.succeeded == 1, what="the first run")
            done = QueuedTask.objects.using(alias).get(pk=result.id)
            assert (done.status, done.lease_expires_at) == (TaskResultStatus.SUCCESSFUL, None)
            # The completion is lost: the row is as the claim left it, its lease running.
            lease_end = claims_sql_for(QueuedTask, alias).lease_end(1)
            QueuedTask.objects.using(alias).filter(pk=result.id).update(
                status=TaskResultStatus.RUNNING,
                finished_at=None,
                return_value=None,
                lease_expires_at=lease_end,
            )
            wait_for(lambda: worker.stats.succeeded == 2, what="the task run again")
        finally:
            worker.stop()
            thread.join(timeout=30)
        assert not thread.is_alive()
        assert not isinstance(outcome[0], BaseException), outcome
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 42
        assert result.worker_ids == ["w", "w"]
        assert [error.exception_class_path for error in result.errors] == ["lockkit.tasks.errors.WorkerLost"]
