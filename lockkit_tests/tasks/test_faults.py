"""Faults as real processes: ``manage.py lockkit_worker`` killed, poisoned, frozen past its lease, stopped politely.

Each worker is a separate process on the test databases (``lockkit_tests.tasks.worker_settings``); the tests wait
on the files tasks write and on the task rows (by the database clock), never on bare sleeps.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, transaction
from django.tasks import TaskResultStatus

from lockkit.tasks.models import QueuedTask
from lockkit_tests.models import Owner
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import (
    APPS,
    backend_on,
    freeze,
    lease_expired,
    marker,
    run_worker,
    status_of,
    vendor_aliases,
    wait_for,
    worker_process,
)

ALL = vendor_aliases(apps=APPS)
POSTGRESQL, MARIADB, SQLITE = ALL


@pytest.mark.parametrize("alias", ALL)
def test_sigkill_mid_task_is_retried_and_the_lost_attempt_recorded(alias: str, tmp_path: Path) -> None:
    """A worker killed mid-task leaves its claim; the next worker takes it when the lease ends (no reaper)."""
    opts = {"lease": 1, "max_attempts": 3}
    with backend_on(alias, **opts) as backend:
        result = jobs.hang_on_first_attempt.enqueue(marker(tmp_path, "k"))
        with worker_process(alias, "--worker-id", "doomed", options=opts) as doomed:
            wait_for(lambda: Path(marker(tmp_path, "k") + ".started").exists(), what="the task to start")
            doomed.signal(signal.SIGKILL)
            code, _ = doomed.wait()
        assert code == -signal.SIGKILL
        row = QueuedTask.objects.using(alias).get()
        assert row.status == TaskResultStatus.RUNNING  # the dead worker's claim, until its lease ends
        wait_for(lambda: lease_expired(alias), what="the dead worker's lease to expire")
        stats = run_worker(backend, worker_id="rescuer")
        assert stats.succeeded == 1
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 2
        assert result.worker_ids == ["doomed", "rescuer"]
        [lost] = result.errors
        assert lost.exception_class_path == "lockkit.tasks.errors.WorkerLost"
        assert "attempt 1 of task" in lost.traceback
        assert "by worker 'doomed' ended without a result" in lost.traceback


@pytest.mark.parametrize("alias", [POSTGRESQL, SQLITE])
def test_poison_task_fails_after_max_attempts(alias: str) -> None:
    """A task that kills its worker every time is FAILED after max_attempts, saying so; it never crash-loops."""
    opts = {"lease": 1, "max_attempts": 2}
    with backend_on(alias, **opts) as backend:
        result = jobs.kill_own_worker.enqueue()
        for attempt in (1, 2):
            with worker_process(alias, "--burst", "--worker-id", f"victim-{attempt}", options=opts) as victim:
                code, output = victim.wait()
            assert code == -signal.SIGKILL, output
            wait_for(lambda: lease_expired(alias), what=f"attempt {attempt}'s lease to expire")
        stats = run_worker(backend, worker_id="judge")
        assert (stats.failed, stats.succeeded) == (1, 0)
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert result.worker_ids == ["victim-1", "victim-2"]  # the judging claim is not an attempt
        assert [e.exception_class_path for e in result.errors] == ["lockkit.tasks.errors.WorkerLost"] * 2
        assert "by worker 'victim-2' ended without a result" in result.errors[1].traceback
        assert list(run_worker(backend).ids) == []  # nothing left to run


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_sigstop_past_the_lease_the_stale_worker_writes_nothing(alias: str, tmp_path: Path) -> None:
    """Frozen past its lease, a worker's task is taken and finished by another; thawed, it writes nothing.

    The running task's database effect is written in ``lockkit.tasks.fenced()``: exactly once in all; the task
    it had claimed but not started is not started once it thaws (its claim was taken).
    """
    prefix = marker(tmp_path, "s")
    opts = {"lease": 1, "max_attempts": 3}
    with backend_on(alias, **opts) as backend:
        result = jobs.slow_then_fenced_write.enqueue(prefix, 3.0, alias)
        waiting = jobs.fenced_effect.enqueue("waiting-effect")  # claimed with the first, not started
        with worker_process(alias, "--worker-id", "frozen", "--claim-batch", "2", options=opts) as frozen:
            wait_for(lambda: list(tmp_path.glob("s.*.started")), what="the task to start")
            freeze(frozen, alias)  # not inside a heartbeat's transaction: its row locks would hide the tasks
            wait_for(lambda: lease_expired(alias), what="the frozen worker's lease to expire")
            stats = run_worker(backend, worker_id="thawed-out")
            assert stats.succeeded == 2
            frozen.signal(signal.SIGCONT)
            # The frozen worker wakes inside its task: its fenced() finds the claim stale and writes nothing.
            wait_for(
                lambda: "was taken by another worker" in frozen.log(), what="the stale worker to give up"
            )
            frozen.signal(signal.SIGTERM)
            code, output = frozen.wait()
        assert code == 0, output
        # The running task is lost (its fenced() found the claim taken). The claimed task it never started is
        # lost too when its runner reaches it before the SIGTERM, or given back by the SIGTERM, whose fenced
        # release finds the claim taken and writes nothing: either way it is not run here (asserted below).
        lost = re.search(r"worker frozen: .*?(\d+) lost", output)
        assert lost is not None, output
        assert lost.group(1) in {"1", "2"}, output
        waiting.refresh()
        assert waiting.status == TaskResultStatus.SUCCESSFUL
        assert waiting.worker_ids == ["frozen", "thawed-out"]  # claimed by the frozen worker, never run by it
        assert Owner.objects.using(alias).filter(name="waiting-effect").count() == 1
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.worker_ids == ["frozen", "thawed-out"]
        assert Owner.objects.using(alias).filter(name__startswith="effect-").count() == 1
        assert str(result.return_value).startswith("written by token ")


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_sigterm_finishes_the_running_task_gives_back_the_others_and_exits_0(
    alias: str, tmp_path: Path
) -> None:
    prefix = marker(tmp_path, "t")
    with backend_on(alias, lease=5):
        running = jobs.slow.enqueue(prefix, 1.0)
        waiting = [jobs.noop_task.enqueue() for _ in range(3)]
        with worker_process(
            alias, "--claim-batch", "4", "--concurrency", "1", "--worker-id", "polite"
        ) as worker:
            wait_for(lambda: Path(prefix + ".started").exists(), what="the slow task to start")
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        assert Path(prefix + ".done").exists()
        running.refresh()
        assert running.status == TaskResultStatus.SUCCESSFUL
        assert running.return_value == "slept"
        for result in waiting:
            result.refresh()
            assert result.status == TaskResultStatus.READY
            assert result.worker_ids == []  # given back: no attempt counted
            assert QueuedTask.objects.using(alias).get(pk=result.id).attempts == 0  # nor by lockkit.claims
        assert not QueuedTask.objects.using(alias).filter(lease_expires_at__isnull=False).exists()
        assert "3 given back" in output


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_second_sigterm_stops_at_once(alias: str, tmp_path: Path) -> None:
    prefix = marker(tmp_path, "u")
    with backend_on(alias, lease=5):
        running = jobs.slow.enqueue(prefix, 60.0)
        with worker_process(alias, "--worker-id", "impatient") as worker:
            wait_for(lambda: Path(prefix + ".started").exists(), what="the slow task to start")
            worker.signal(signal.SIGTERM)
            worker.signal(signal.SIGINT)
            began = time.monotonic()
            code, output = worker.wait(timeout=20)
        assert code == 1, output
        assert time.monotonic() - began < 15
        assert not Path(prefix + ".done").exists()
        running.refresh()
        assert running.status == TaskResultStatus.RUNNING  # its lease will end; another worker takes it


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_notify_wakes_an_idle_worker_before_its_poll(alias: str) -> None:
    """With a 60 s poll, an enqueue's NOTIFY (sent on commit) is what starts the task."""
    with backend_on(alias, poll_interval=60):
        with worker_process(alias, "--worker-id", "sleeper", options={"poll_interval": 60}) as worker:
            # The worker is idle once it has claimed nothing: its first empty claim starts a 60 s wait.
            first = jobs.calculate_meaning_of_life.enqueue()
            wait_for(lambda: QueuedTask.objects.using(alias).filter(status="SUCCESSFUL").exists(), timeout=30)
            time.sleep(0.5)  # idle again (this sleep only lets it reach its wait; the assertion is below)
            began = time.monotonic()
            second = jobs.calculate_meaning_of_life.enqueue()
            wait_for(
                lambda: QueuedTask.objects.using(alias).filter(status="SUCCESSFUL").count() == 2, timeout=30
            )
            woke_after = time.monotonic() - began
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        assert woke_after < 10, f"the worker waited {woke_after:.1f}s: no NOTIFY wake-up"
        for result in (first, second):
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("alias", [MARIADB])
def test_mariadb_idle_transaction_timeout_frees_a_stalled_workers_rows_and_the_worker_goes_on(
    alias: str, tmp_path: Path
) -> None:
    """docs/tasks.md: ``idle_transaction_timeout`` on the workers' sessions bounds how long a stalled one keeps rows.

    The task sits idle inside its ``fenced()`` transaction (as a frozen worker would, between two statements):
    the server ends the session, the row is free at once, that attempt fails with its write rolled back, the
    retry writes it once, and the same worker process goes on to its next task.
    """
    prefix = marker(tmp_path, "i")
    opts = {"lease": 30, "max_attempts": 2, "retry_backoff": 0.1}
    env = {"LOCKKIT_TEST_MYSQL_INIT_COMMAND": "SET SESSION idle_transaction_timeout = 2"}
    with backend_on(alias, **opts):
        result = jobs.fenced_write_then_sleep.enqueue(prefix, 8.0, alias)
        with worker_process(alias, "--worker-id", "stalled", options=opts, env=env) as worker:
            wait_for(lambda: list(tmp_path.glob("i.*.written")), what="the task to write in fenced()")
            # The row lock goes while the task still sleeps: this session can lock the row with NOWAIT.
            wait_for(
                lambda: _locked_nowait(alias, result.id),
                what="the server to end the idle session",
                timeout=15,
            )
            assert not list(tmp_path.glob("i.*.done"))
            wait_for(lambda: status_of(result) == TaskResultStatus.SUCCESSFUL, what="the retry")
            after = jobs.noop_task.enqueue()
            wait_for(lambda: status_of(after) == TaskResultStatus.SUCCESSFUL, what="the next task")
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        assert result.worker_ids == ["stalled", "stalled"]
        assert len(result.errors) == 1, result.errors
        # The first attempt's write rolled back with its session: one effect, the retry's.
        assert Owner.objects.using(alias).filter(name__startswith="idle-").count() == 1
        assert after.worker_ids == ["stalled"]


def _locked_nowait(alias: str, pk: Any) -> bool:
    """Whether this session locks the task's row without waiting (``False`` while another session holds it)."""
    try:
        with transaction.atomic(using=alias):
            locked = QueuedTask.objects.using(alias).select_for_update(nowait=True).get(pk=pk)
    except OperationalError:
        return False
    assert locked.status == TaskResultStatus.RUNNING
    return True
