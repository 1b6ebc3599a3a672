"""An outcome the database lost after the worker saw it commit: the task runs again, it is not renewed forever.

A failover to an asynchronous standby, or a crash of a server with ``synchronous_commit = off``, can lose a commit
the client was told succeeded: the task's row is back as the claim left it (``RUNNING``, claimed by the worker,
its token). Found by an acceptance trial: an ``immediate`` restart of such a server under two workers left two
tasks ``RUNNING`` for as long as the workers ran, their heartbeat renewing the claims. Here the lost commit is
written back as the database would present it, under a real worker on every vendor.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections
from django.tasks import TaskResultStatus

from lockkit.claims.sql import claims_sql_for
from lockkit.tasks.models import QueuedTask
from lockkit.tasks.worker import Stats, Worker
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, vendor_aliases, wait_for


@contextmanager
def running(worker: Worker) -> Iterator[None]:
    """Run ``worker`` on a thread for the block; then stop it and check it stopped cleanly (its error re-raised)."""
    outcome: list[Stats | BaseException] = []

    def run() -> None:
        try:
            outcome.append(worker.run())
        except BaseException as failure:  # re-raised below
            outcome.append(failure)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert not isinstance(outcome[0], BaseException), outcome


@pytest.mark.parametrize("alias", vendor_aliases())
@pytest.mark.parametrize(
    ("job", "args", "value"),
    [
        pytest.param(jobs.calculate_meaning_of_life, (), 42, id="plain"),
        # The success written by the task's own fenced() block (its transaction): before, its claim was not
        # remembered as ended, and a lost commit left the task RUNNING, renewed for as long as the worker ran.
        pytest.param(jobs.fenced_effect, ("lost",), "lost", id="fenced"),
    ],
)
def test_a_completion_the_database_lost_is_given_back_and_run_again(
    alias: str, job: Any, args: tuple[Any, ...], value: Any
) -> None:
    with backend_on(alias, lease=1, max_attempts=3) as backend:
        result = job.enqueue(*args)
        worker = Worker(backend, queues=sorted(backend.queues), worker_id="w")
        with running(worker):
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
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == value
        assert result.worker_ids == ["w", "w"]
        assert [error.exception_class_path for error in result.errors] == ["lockkit.tasks.errors.WorkerLost"]


REFUSE = """
CREATE FUNCTION lockkit_test_refuse_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('SUCCESSFUL', 'FAILED') THEN
        RAISE EXCEPTION 'the test refuses outcomes';
    END IF;
    RETURN NEW;
END $$
"""


@pytest.mark.django_db(transaction=True, databases=["default"], available_apps=APPS)
def test_an_outcome_the_database_keeps_refusing_is_given_back_not_renewed_for_ever() -> None:
    # A trigger fails every outcome write (SQLSTATE P0001, not a refusal of the values: retried for a lease) while
    # the heartbeat, which moves only leases, succeeds: before the fix the task stayed RUNNING, renewed for ever.
    table = connections["default"].ops.quote_name(QueuedTask._meta.db_table)
    with connections["default"].cursor() as cursor:
        cursor.execute(REFUSE)
        cursor.execute(
            f"CREATE TRIGGER lockkit_test_refuse BEFORE UPDATE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION lockkit_test_refuse_outcome()"
        )
    try:
        with backend_on("default", lease=1, max_attempts=5) as backend:
            # No return value: the write is retried for a lease, then given up (a value would be recorded as
            # refused instead, the attempt failed).
            result = jobs.noop_task.enqueue()
            worker = Worker(backend, queues=sorted(backend.queues), worker_id="w")
            with running(worker):
                # Given back, then claimed again (by the same worker: the only one).
                wait_for(
                    lambda: len(QueuedTask.objects.get(pk=result.id).worker_ids) >= 2,
                    timeout=30,
                    what="the task given back and claimed again",
                )
                with connections["default"].cursor() as cursor:
                    cursor.execute(f"DROP TRIGGER lockkit_test_refuse ON {table}")
                wait_for(
                    lambda: QueuedTask.objects.get(pk=result.id).status == TaskResultStatus.SUCCESSFUL,
                    timeout=30,
                    what="the task recorded once the database accepts it",
                )
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS lockkit_test_refuse ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS lockkit_test_refuse_outcome()")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value is None
    assert result.worker_ids[:2] == ["w", "w"]
    assert result.errors[0].exception_class_path == "lockkit.tasks.errors.WorkerLost"
