"""Successes completed in batches are written soon after they end, not when the thread's next task ends.

With ``--claim-batch`` or ``--concurrency`` above 1 the worker completes successes together (one statement per
batch). Found by a new user's trial: a task that had ended stayed ``RUNNING`` for as long as the next task of its
thread ran, and ran again when the worker was killed meanwhile. Here the next task runs for 60 s: the ended tasks
must be ``SUCCESSFUL`` while it still runs, and a ``SIGKILL`` then must not run them again.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from django.tasks import TaskResultStatus

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

POSTGRESQL, MARIADB, _ = vendor_aliases(apps=APPS)


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
@pytest.mark.parametrize(
    "args",
    [("--claim-batch", "4"), ("--concurrency", "2", "--claim-batch", "4")],
    ids=["claim-batch", "concurrency"],
)
def test_ended_tasks_are_successful_while_the_next_one_runs_and_a_kill_does_not_run_them_again(
    alias: str, args: tuple[str, ...], tmp_path: Path
) -> None:
    with backend_on(alias, lease=30, max_attempts=3) as backend:
        quick = [jobs.slow.enqueue(marker(tmp_path, f"quick-{n}"), 0.0) for n in range(2)]
        long = [jobs.slow.enqueue(marker(tmp_path, f"long-{n}"), 60.0) for n in range(2)]
        with worker_process(alias, *args, "--worker-id", "batching") as worker:
            wait_for(
                lambda: Path(marker(tmp_path, "long-0") + ".started").exists(), what="a long task to start"
            )
            wait_for(
                lambda: [status_of(r) for r in quick] == [TaskResultStatus.SUCCESSFUL] * 2,
                what="the ended tasks to be recorded while a long one runs",
                timeout=20,
            )
            assert not Path(
                marker(tmp_path, "long-0") + ".done"
            ).exists()  # still running: nothing waited for it
            worker.signal(signal.SIGKILL)
            worker.process.wait(timeout=30)
        for result in quick:
            result.refresh()
            assert result.worker_ids == ["batching"]
            assert result.return_value == "slept"
        assert all(
            status_of(r) == TaskResultStatus.RUNNING for r in long
        )  # killed mid-task: its claim stands
    # A new worker after the kill does not run the ended tasks again (their rows say SUCCESSFUL).
    with backend_on(alias, lease=30, max_attempts=3) as backend:
        stats = run_worker(backend, worker_id="after")
        assert stats.succeeded == 0  # the long tasks' claims have not expired; the quick ones are done
        assert [status_of(r) for r in quick] == [TaskResultStatus.SUCCESSFUL] * 2
