"""A worker restarted with the same ``--worker-id`` lets its dead predecessor's claims expire; it does not renew them.

A unit file that restarts ``lockkit_worker --worker-id NAME`` under a fixed name: the heartbeat renews a worker's
claims by its name, so the restarted worker renewed the claims of the one SIGKILLed before it, at every beat, and
their tasks stayed ``RUNNING`` for as long as it ran. The worker running at the same time under the same name (a
live twin, which renews its own claims) is test_unrecorded_claims.py's
``test_while_every_claim_succeeds_a_claim_it_did_not_make_is_left_alone``.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from django.tasks import TaskResultStatus

from lockkit.claims import claim_next
from lockkit.claims.sql import claims_sql_for
from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import (
    backend_on,
    marker,
    run_worker,
    status_of,
    vendor_aliases,
    wait_for,
    worker_process,
)

POSTGRESQL, MARIADB, SQLITE = vendor_aliases()


def _unexpired(alias: str, pk: str) -> bool:
    """Whether the task's claim still has lease left, by the database clock (as the heartbeat sees it)."""
    now = claims_sql_for(QueuedTask, alias).now()
    return QueuedTask.objects.using(alias).filter(pk=pk, lease_expires_at__gt=now).exists()


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_a_worker_restarted_with_the_same_worker_id_lets_its_predecessor_s_claims_expire(
    alias: str, tmp_path: Path
) -> None:
    with backend_on(alias, max_attempts=1):
        long = jobs.slow.enqueue(marker(tmp_path, "long"), 120.0)
        # An 8 s lease, renewed every third: at least 5 s of it left when the worker is killed.
        with worker_process(alias, "--worker-id", "fixed", "--lease", "8", "--interval", "0.2") as first:
            wait_for(lambda: Path(marker(tmp_path, "long") + ".started").exists(), what="the task to start")
            first.signal(signal.SIGKILL)
            first.process.wait(timeout=30)
        assert status_of(long) == TaskResultStatus.RUNNING
        (token,) = QueuedTask.objects.using(alias).filter(pk=long.id).values_list("claim_token", flat=True)
        with worker_process(alias, "--worker-id", "fixed", "--lease", "2", "--interval", "0.2") as restarted:
            # Logged once it has read the claims under its name, just before its first beat.
            wait_for(lambda: "worker fixed: queues" in restarted.log(), what="the worker to start")
            # The test means something only if the worker beats before the dead one's lease ends: every beat of
            # the old code renewed it, for as long as the worker ran.
            assert _unexpired(alias, long.id), (
                "the lease ran out before the restarted worker started: no test"
            )
            # The lease ends (no beat renews it) and the worker takes the task back as any expired claim: a
            # second attempt beyond max_attempts=1, so WorkerLost is recorded for the first and it fails.
            wait_for(lambda: status_of(long) == TaskResultStatus.FAILED, timeout=30, what="the task to fail")
            assert "1 task(s) were claimed under this worker id before it started" in restarted.log()
        assert [e.exception_class_path for e in long.errors] == ["lockkit.tasks.errors.WorkerLost"]
        assert long.worker_ids == ["fixed"]  # the attempt that ran: the second one never started
        row = QueuedTask.objects.using(alias).get(pk=long.id)
        assert (row.claim_token, row.lease_expires_at) == (
            token + 1,
            None,
        )  # taken back by a new claim, ended
        assert not Path(marker(tmp_path, "long") + ".done").exists()


@pytest.mark.parametrize("alias", [POSTGRESQL, SQLITE])
def test_a_worker_restarted_under_a_name_holding_a_full_claim_batch_still_renews_its_own_claims(
    alias: str, tmp_path: Path
) -> None:
    """Its predecessor held a whole ``--claim-batch 1000`` (the largest) when it died: each of those claims is left
    out of every beat of the restarted worker, which must still renew the claims it makes itself (SQLite refuses
    an expression deeper than 1000 terms: a beat naming each claim apart failed, every time)."""
    held = 1000
    with backend_on(alias, max_attempts=1) as backend:
        for _ in range(held):
            jobs.noop_task.enqueue()
        claimed = claim_next(
            QueuedTask.objects.using(alias).filter(status=TaskResultStatus.READY),
            worker="fixed",
            lease=300,
            limit=held,
            set={"status": TaskResultStatus.RUNNING},
        )
        assert len(claimed) == held
        before = dict(QueuedTask.objects.using(alias).values_list("pk", "lease_expires_at"))
        # Longer than its 1 s lease: only the restarted worker's beats keep its claim (else it is taken again).
        long = jobs.slow.enqueue(marker(tmp_path, "long"), 2.5)
        stats = run_worker(backend, worker_id="fixed", lease=1, concurrency=2)
        long.refresh()
    assert (long.status, long.worker_ids, long.errors) == (TaskResultStatus.SUCCESSFUL, ["fixed"], [])
    assert (stats.succeeded, stats.failed, stats.lost) == (1, 0, 0)
    after = dict(QueuedTask.objects.using(alias).exclude(pk=long.id).values_list("pk", "lease_expires_at"))
    assert after == before  # the predecessor's claims: not renewed
