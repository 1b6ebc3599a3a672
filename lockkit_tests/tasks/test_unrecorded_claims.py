"""A claim made for the worker that it never recorded is given back and run, not renewed for ever.

Found by a hostile review through a relay cutting 5% of replies: a claiming message whose reply was lost (and that
its rows could not decide) raised, yet had claimed tasks; the heartbeat renews every claim of the worker, so those
tasks stayed ``RUNNING``, renewed, never run, until the worker stopped. (lockkit_tests/faults/test_dead_autocommit.py
has the MariaDB half of that review's finding.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections, transaction
from django.db.models import F, Value
from django.db.models.functions import Concat
from django.tasks import TaskResultStatus

from lockkit.claims import claim_next, heartbeat_every
from lockkit.tasks.models import WORKER_SEPARATOR, QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, status_of, vendor_aliases, wait_for, worker_process

POSTGRESQL, MARIADB, _ = vendor_aliases(apps=APPS)


@contextmanager
def table_locked(alias: str) -> Iterator[None]:
    """Hold ``EXCLUSIVE`` on the task table from a connection of its own, in a thread, for the block.

    Claims and heartbeats wait for it (their lock timeout), plain reads do not: an idle worker's read of its next
    due task (no lock timeout) would wait for the whole block, and claim nothing meanwhile.
    """
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        connection = connections.create_connection(alias)
        try:
            with connection.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute(f"LOCK TABLE {QueuedTask._meta.db_table} IN EXCLUSIVE MODE")
                locked.set()
                assert release.wait(60)
                cursor.execute("ROLLBACK")
        finally:
            connection.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert locked.wait(30)
    try:
        yield
    finally:
        release.set()
        thread.join(timeout=30)


@pytest.mark.parametrize("alias", [POSTGRESQL])
def test_a_claim_made_for_the_worker_that_it_never_recorded_is_given_back_and_run(alias: str) -> None:
    # A lease longer than the table lock below (the claim's 5 s lock timeout): the task is not reclaimed as expired.
    with backend_on(alias, lease=15, max_attempts=1) as backend:
        # The worker's own lease too: its heartbeat renews the orphan to its lease, and a 5 s one could run out
        # while the table lock below stalls the beats on a loaded machine (a CI preview: reclaimed as expired).
        options = {"lease": 15, "max_attempts": 1}
        with worker_process(alias, "--worker-id", "orphans", "--interval", "0.2", options=options) as worker:
            # Made once the worker has started (its log line comes after it read the claims held under its name):
            # a claim found at its start is a predecessor's, left to expire (test_reused_worker_id.py).
            wait_for(lambda: "worker orphans: queues" in worker.log(), what="the worker to start")
            # What a claiming message whose reply was lost leaves: the task claimed for the worker, which never
            # saw it (enqueued in the same transaction: the worker cannot claim it first).
            with transaction.atomic(using=alias):
                result = jobs.calculate_meaning_of_life.enqueue()
                (made,) = claim_next(
                    QueuedTask.objects.using(alias).filter(pk=result.id),
                    worker="orphans",
                    lease=15,
                    set={
                        "status": TaskResultStatus.RUNNING,
                        "worker_log": Concat(F("worker_log"), Value("orphans" + WORKER_SEPARATOR)),
                    },
                )
            # A claim of the worker's fails (its lock timeout, behind a table lock): as a lost reply does.
            with table_locked(alias):
                wait_for(lambda: "claiming failed" in worker.log(), timeout=30, what="a claim to fail")
            wait_for(
                lambda: status_of(result) == TaskResultStatus.SUCCESSFUL, timeout=30, what="the task to run"
            )
            assert "claimed by a message whose reply was lost; giving it back" in worker.log()
        assert backend.get_result(result.id).return_value == 42
        row = QueuedTask.objects.using(alias).get(pk=result.id)
        # Given back uncounted (it never ran), then run once: one attempt, max_attempts=1 not exhausted.
        assert (row.attempts, row.worker_ids, row.claim_token) == (1, ["orphans"], made.token + 1)


@pytest.mark.django_db(transaction=True, available_apps=APPS)
def test_while_every_claim_succeeds_a_claim_it_did_not_make_is_left_alone() -> None:
    """Another worker given the same ``--worker-id`` is not taken for a lost claim (its task is not taken away).

    The twin is alive: its heartbeat renews its claims, the one made before the worker started (which the worker
    leaves to it, test_reused_worker_id.py) and the one made after (which both renew).
    """
    alias = "default"
    with backend_on(alias, lease=3) as backend:
        before = jobs.calculate_meaning_of_life.enqueue()
        mine = QueuedTask.objects.using(alias)
        claim_next(mine.filter(pk=before.id), worker="twin", lease=3, set={})
        with (
            heartbeat_every(mine, worker="twin", lease=3, interval=0.5) as twin,
            worker_process(alias, "--worker-id", "twin", "--interval", "0.2") as worker,
        ):
            wait_for(lambda: "worker twin: queues" in worker.log(), what="the worker to start")
            with transaction.atomic(using=alias):  # the worker cannot claim it first
                after = jobs.calculate_meaning_of_life.enqueue()
                claim_next(mine.filter(pk=after.id), worker="twin", lease=3, set={})
            claims = {row.pk: row.claim_token for row in mine.filter(claimed_by="twin")}
            assert len(claims) == 2
            # More than the lease, and a beat interval (1 s) after several beats.
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                # Neither taken back as expired (a new token) by the worker (or anyone): the twin holds both.
                assert {row.pk: row.claim_token for row in mine.filter(claimed_by="twin")} == claims
                time.sleep(0.2)
            assert twin.error is None
            assert "giving it back" not in worker.log()
            assert "1 task(s) were claimed under this worker id before it started" in worker.log()
        assert [backend.get_result(r.id).status for r in (before, after)] == [TaskResultStatus.READY] * 2
