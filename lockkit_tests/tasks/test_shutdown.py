"""Stopping and waking a real ``manage.py lockkit_worker``: SIGTERM then SIGKILL, and a LISTEN session cut off."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.tasks import TaskResultStatus

from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import (
    APPS,
    backend_on,
    marker,
    run_worker,
    status_of,
    vendor_aliases,
    wait_for,
    worker_process,
)

POSTGRESQL, MARIADB, _SQLITE = vendor_aliases(apps=APPS)


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_sigterm_gives_back_unstarted_claims_at_once_so_a_sigkill_charges_them_nothing(
    alias: str, tmp_path: Path
) -> None:
    """The grace period of systemd or Kubernetes is shorter than the running task: SIGTERM, then SIGKILL.

    The claimed tasks the worker had not started go back when SIGTERM arrives, not when the running task ends, so
    the SIGKILL charges them no attempt: with ``max_attempts=1`` they still run, on the next worker.
    """
    prefix = marker(tmp_path, "g")
    opts = {"lease": 30, "max_attempts": 1}
    with backend_on(alias, **opts) as backend:
        running = jobs.slow.enqueue(prefix, 60.0)
        waiting = [jobs.calculate_meaning_of_life.enqueue() for _ in range(3)]
        args = ("--concurrency", "1", "--claim-batch", "4", "--worker-id", "graceful")
        # No logging configured, as in a project that configures none: the stop is said on stderr all the same.
        quiet = {"LOCKKIT_TASKS_TEST_NO_LOGGING": "1"}
        with worker_process(alias, *args, options=opts, env=quiet) as worker:
            wait_for(lambda: Path(prefix + ".started").exists(), what="the slow task to start")
            assert QueuedTask.objects.using(alias).filter(status="RUNNING").count() == 4  # all four claimed
            worker.signal(signal.SIGTERM)
            wait_for(
                lambda: all(status_of(r) == TaskResultStatus.READY for r in waiting),
                timeout=15,
                what="the unstarted tasks to be given back while the running one runs",
            )
            assert worker.process.poll() is None
            assert not Path(prefix + ".done").exists()
            worker.signal(signal.SIGKILL)  # the grace period is over
            code, output = worker.wait()
        assert code == -signal.SIGKILL
        assert "worker graceful: SIGTERM: stopping: finishing the running task(s)" in output, output
        for result in waiting:
            row = QueuedTask.objects.using(alias).get(pk=result.id)
            assert (row.attempts, row.worker_ids, row.lease_expires_at) == (0, [], None)
        assert (
            status_of(running) == TaskResultStatus.RUNNING
        )  # its lease runs out later; it ran, it is charged
        stats = run_worker(backend, worker_id="next")
        assert sorted(stats.ids) == sorted(r.id for r in waiting)
        for result in waiting:
            result.refresh()
            assert (result.status, result.worker_ids, result.errors) == (
                TaskResultStatus.SUCCESSFUL,
                ["next"],
                [],
            )


def _wait_given_back(alias: str, waiting: list[Any], what: str) -> None:
    """Wait until every task of ``waiting`` is ``READY`` again with no attempt counted and no lease."""
    unclaimed = QueuedTask.objects.using(alias).filter(
        pk__in=[r.id for r in waiting], status="READY", attempts=0, lease_expires_at__isnull=True
    )
    wait_for(lambda: unclaimed.count() == len(waiting), timeout=15, what=what)


@pytest.mark.parametrize("after_asyncio", [False, True], ids=["first", "after-an-asyncio-task"])
@pytest.mark.parametrize("alias", [MARIADB])
def test_sigterm_while_the_task_is_inside_a_driver_call_gives_back_unstarted_claims_at_once(
    alias: str, after_asyncio: bool, tmp_path: Path
) -> None:
    """``--concurrency 1`` runs the task on the main thread, where Python runs a signal handler only between two
    bytecodes: inside a long driver call (MariaDB's ``SLEEP``) the stop still begins at once (found by a review: the
    unstarted claims stayed ``RUNNING`` and the SIGKILL failed them with max_attempts=1, never run). Also when the
    task before it ran an asyncio loop with signal handlers, which leaves no signal wakeup fd when it closes (found
    by a second review)."""
    prefix = marker(tmp_path, "d")
    opts = {"lease": 30, "max_attempts": 1}
    with backend_on(alias, **opts):
        if after_asyncio:
            jobs.asyncio_with_signal_handler.using(priority=10).enqueue()  # claimed and run first
        running = jobs.sleep_in_the_database.using(priority=5).enqueue(prefix, 60, alias)
        waiting = [jobs.calculate_meaning_of_life.enqueue() for _ in range(3)]
        args = ("--concurrency", "1", "--claim-batch", "5", "--worker-id", "in-driver")
        with worker_process(alias, *args, options=opts) as worker:
            wait_for(lambda: Path(prefix + ".started").exists(), what="the task to start")
            worker.signal(signal.SIGTERM)
            _wait_given_back(
                alias, waiting, "the unstarted tasks to be given back while the task sleeps in the database"
            )
            assert worker.process.poll() is None
            worker.signal(signal.SIGKILL)
            code, output = worker.wait()
        assert code == -signal.SIGKILL
        assert "worker in-driver: SIGTERM: stopping" in output, output
        assert status_of(running) == TaskResultStatus.RUNNING


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_a_second_sigterm_stops_the_worker_at_once(alias: str, tmp_path: Path) -> None:
    """The first SIGTERM finishes the running task; a second one ends the process at once, with status 1."""
    prefix = marker(tmp_path, "s")
    opts = {"lease": 30, "max_attempts": 1}
    with backend_on(alias, **opts):
        jobs.slow.enqueue(prefix, 60.0)
        waiting = jobs.calculate_meaning_of_life.enqueue()
        args = ("--concurrency", "1", "--claim-batch", "2", "--worker-id", "twice")
        with worker_process(alias, *args, options=opts) as worker:
            wait_for(lambda: Path(prefix + ".started").exists(), what="the slow task to start")
            worker.signal(signal.SIGTERM)
            wait_for(lambda: status_of(waiting) == TaskResultStatus.READY, what="the first stop to begin")
            worker.signal(signal.SIGTERM)
            code, output = worker.wait(timeout=15)
        assert code == 1, output
        assert "worker twice: second SIGTERM: stopping at once" in output, output
        assert not Path(prefix + ".done").exists()


_SLOW_CLAIMS = """
CREATE FUNCTION lockkit_tests_slow_claim() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM pg_sleep(1.5); RETURN NEW; END $$;
CREATE TRIGGER lockkit_tests_slow_claim BEFORE UPDATE ON lockkit_tasks_queuedtask FOR EACH ROW
  WHEN (OLD.status = 'READY' AND NEW.status = 'RUNNING') EXECUTE FUNCTION lockkit_tests_slow_claim();
"""
_NO_SLOW_CLAIMS = """
DROP TRIGGER IF EXISTS lockkit_tests_slow_claim ON lockkit_tasks_queuedtask;
DROP FUNCTION IF EXISTS lockkit_tests_slow_claim();
"""


def _claims_in_flight(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()"
        )
        (count,) = cursor.fetchone()
    return int(count)


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_sigterm_while_a_claim_is_in_flight_gives_its_tasks_back_at_once(alias: str, tmp_path: Path) -> None:
    """SIGTERM arrives while a claim is in the database (each claimed row made to wait there) and another task runs:
    the claim's tasks go back when it returns, not when the running task ends (found by a review: they stayed
    RUNNING, and the SIGKILL after the grace period failed them with max_attempts=1, never run)."""
    prefix = marker(tmp_path, "f")
    opts = {"lease": 30, "max_attempts": 1}
    with backend_on(alias, **opts):
        running = jobs.slow.enqueue(prefix, 60.0)
        args = ("--concurrency", "2", "--worker-id", "inflight")
        with worker_process(alias, *args, options=opts) as worker:
            wait_for(lambda: Path(prefix + ".started").exists(), what="the slow task to start")
            with connections[alias].cursor() as cursor:
                cursor.execute(_SLOW_CLAIMS)
            try:
                waiting = [jobs.calculate_meaning_of_life.enqueue() for _ in range(2)]
                wait_for(lambda: _claims_in_flight(alias) > 0, what="a claim in flight")
                worker.signal(signal.SIGTERM)
                # Until the claim commits its rows read READY to everyone else: wait for it to end first.
                wait_for(lambda: _claims_in_flight(alias) == 0, timeout=10, what="the claim to end")
                _wait_given_back(
                    alias, waiting, "the claimed tasks to be given back while the running one runs"
                )
                assert worker.process.poll() is None
                assert not Path(prefix + ".done").exists()
            finally:
                with connections[alias].cursor() as cursor:
                    cursor.execute(_NO_SLOW_CLAIMS)
            worker.signal(signal.SIGKILL)
            worker.wait()
        for result in waiting:
            row = QueuedTask.objects.using(alias).get(pk=result.id)
            assert (row.status, row.attempts, row.worker_ids, row.lease_expires_at) == ("READY", 0, [], None)
        assert status_of(running) == TaskResultStatus.RUNNING


def _listener_pids(alias: str) -> list[int]:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
            ["LISTEN lockkit_tasks"],
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_a_task_enqueued_while_the_worker_listens_again_runs_without_waiting_a_poll(alias: str) -> None:
    """The LISTEN session is terminated; a NOTIFY sent before the worker listens again reaches nobody.

    The worker looks for ready tasks as soon as it listens again: the task runs long before the 30 s poll.
    """
    opts = {"poll_interval": 30}
    with backend_on(alias, **opts):
        with worker_process(alias, "--worker-id", "listener", options=opts) as worker:
            [pid] = wait_for(lambda: _listener_pids(alias), what="the worker to LISTEN")
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            wait_for(lambda: pid not in _listener_pids(alias), what="the LISTEN session to end")
            began = time.monotonic()
            result = jobs.calculate_meaning_of_life.enqueue()  # its NOTIFY: sent on commit, to no listener
            assert _listener_pids(alias) == [], "the worker listened again before the enqueue: inconclusive"
            wait_for(lambda: status_of(result) == TaskResultStatus.SUCCESSFUL, timeout=25, what="the task")
            waited = time.monotonic() - began
            # The worker polls while it has no LISTEN session: under load the task may run before it listens again.
            wait_for(lambda: _listener_pids(alias), timeout=10, what="the worker to listen again")
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        assert waited < 10, f"the task waited {waited:.1f}s: a poll_interval, not the re-LISTEN"
