"""``lockkit.tasks.fenced()`` and the outcome around it: the return value, and earlier attempts lost with workers.

Real worker processes, killed with real signals, and real sessions ended on the server. After ``fenced()`` commits
the task is ``SUCCESSFUL`` for good; its return value is written after the function returns. A worker that dies in
between leaves a result that says its value was not recorded (never a ``None`` indistinguishable from a task that
returned ``None``); a lost connection is reconnected and the value written.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from django.tasks import TaskResultStatus

from lockkit.tasks.errors import ReturnValueNotRecorded
from lockkit.tasks.models import QueuedTask
from lockkit_tests.models import Owner
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import (
    APPS,
    backend_on,
    lease_expired,
    marker,
    run_worker,
    vendor_aliases,
    wait_for,
    worker_process,
)

ALL = vendor_aliases(apps=APPS)
POSTGRESQL, MARIADB, SQLITE = ALL


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_worker_killed_after_fenced_leaves_a_result_that_says_its_value_is_missing(alias: str) -> None:
    with backend_on(alias, lease=1) as backend:
        result = jobs.fenced_then_die.enqueue("paid")
        with worker_process(alias, "--burst", "--worker-id", "dies", options={"lease": 1}) as worker:
            code, output = worker.wait()
        assert code == -signal.SIGKILL, output
        assert Owner.objects.using(alias).filter(name="paid").count() == 1
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL  # committed with the block: never run again
        with pytest.raises(ReturnValueNotRecorded, match="not recorded"):
            _ = result.return_value
        with pytest.raises(ValueError, match="not recorded"):  # a ValueError, as Django's return_value raises
            _ = result.return_value
        wait_for(
            lambda: (
                lease_expired(alias)
                or not QueuedTask.objects.using(alias).filter(lease_expires_at__isnull=False).exists()
            )
        )
        assert list(run_worker(backend).ids) == []  # not run again
        assert Owner.objects.using(alias).filter(name="paid").count() == 1


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_connection_lost_after_fenced_is_reconnected_and_the_value_recorded(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.fenced_then_lose_connection.enqueue("shipped")
        nothing = jobs.fenced_effect.enqueue("returns-a-name")
        stats = run_worker(backend, worker_id="cut")
        assert stats.succeeded == 2
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == "shipped"
        nothing.refresh()
        assert nothing.return_value == "returns-a-name"
        assert Owner.objects.using(alias).filter(name="shipped").count() == 1


@pytest.mark.parametrize("alias", ALL)
def test_a_lost_attempt_is_recorded_when_the_next_one_uses_fenced(alias: str, tmp_path: Path) -> None:
    opts = {"lease": 1, "max_attempts": 3}
    with backend_on(alias, **opts) as backend:
        result = jobs.fenced_after_hang.enqueue(marker(tmp_path, "f"))
        with worker_process(alias, "--worker-id", "doomed", options=opts) as doomed:
            wait_for(lambda: Path(marker(tmp_path, "f") + ".started").exists(), what="the task to start")
            doomed.signal(signal.SIGKILL)
            code, _ = doomed.wait()
        assert code == -signal.SIGKILL
        wait_for(lambda: lease_expired(alias), what="the dead worker's lease to expire")
        assert run_worker(backend, worker_id="rescuer").succeeded == 1
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 2
        assert result.worker_ids == ["doomed", "rescuer"]
        [lost] = result.errors
        assert lost.exception_class_path == "lockkit.tasks.errors.WorkerLost"
        assert "by worker 'doomed' ended without a result" in lost.traceback
        assert Owner.objects.using(alias).filter(name="fenced-2").count() == 1
