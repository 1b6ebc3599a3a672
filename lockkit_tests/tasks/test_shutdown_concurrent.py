"""SIGTERM then SIGKILL of a worker running several tasks at once with a claim batch larger than its runners:
the claimed tasks no runner started go back at SIGTERM (no attempt counted, ``worker_ids`` taken back), the running
ones are charged their attempt, and the next worker runs the given-back ones with ``max_attempts=1``."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
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
def test_sigterm_then_sigkill_with_concurrency_and_a_larger_claim_batch(alias: str, tmp_path: Path) -> None:
    opts = {"lease": 30, "max_attempts": 1}
    prefixes = [marker(tmp_path, f"slow-{n}") for n in range(3)]
    with backend_on(alias, **opts) as backend:
        running = [jobs.slow.enqueue(prefix, 60.0) for prefix in prefixes]
        waiting = [jobs.calculate_meaning_of_life.enqueue() for _ in range(5)]
        args = ("--concurrency", "3", "--claim-batch", "8", "--worker-id", "many")
        with worker_process(alias, *args, options=opts) as worker:
            wait_for(
                lambda: all(Path(prefix + ".started").exists() for prefix in prefixes),
                what="the slow tasks to start",
            )
            assert QueuedTask.objects.using(alias).filter(status="RUNNING").count() == 8  # all claimed
            worker.signal(signal.SIGTERM)
            wait_for(
                lambda: all(status_of(r) == TaskResultStatus.READY for r in waiting),
                timeout=15,
                what="the unstarted tasks to be given back while the running ones run",
            )
            assert worker.process.poll() is None
            worker.signal(signal.SIGKILL)
            code, output = worker.wait()
        assert code == -signal.SIGKILL, output
        for result in waiting:
            row = QueuedTask.objects.using(alias).get(pk=result.id)
            assert (row.status, row.attempts, row.worker_ids, row.lease_expires_at) == ("READY", 0, [], None)
        for slow, prefix in zip(running, prefixes, strict=True):
            row = QueuedTask.objects.using(alias).get(pk=slow.id)
            assert (row.status, row.attempts, row.worker_ids) == ("RUNNING", 1, ["many"])
            assert not Path(prefix + ".done").exists()
        stats = run_worker(backend, worker_id="next")
        assert sorted(stats.ids) == sorted(r.id for r in waiting)
        for result in waiting:
            result.refresh()
            assert (result.status, result.worker_ids, result.errors, result.return_value) == (
                TaskResultStatus.SUCCESSFUL,
                ["next"],
                [],
                42,
            )
