"""Hostile tests of giving back a task whose outcome the database keeps failing (h-hostile-37).

A trigger refuses every update that moves a row out of ``RUNNING`` (outcomes, retries and releases alike), while
claims and heartbeats (which leave ``status`` alone, or set ``RUNNING``) still pass. Then it is dropped: every task
must end in a final state and the worker must stop cleanly.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connections
from django.tasks import TaskResultStatus

from lockkit.tasks.models import QueuedTask
from lockkit.tasks.worker import Stats, Worker
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, vendor_aliases, wait_for

PG_CREATE = [
    """
    CREATE OR REPLACE FUNCTION hx_refuse_leaving_running() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF OLD.status = 'RUNNING' AND NEW.status <> 'RUNNING' THEN
            RAISE EXCEPTION 'hx: the test refuses leaving RUNNING';
        END IF;
        RETURN NEW;
    END $$
    """,
    "CREATE TRIGGER hx_refuse BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION hx_refuse_leaving_running()",
]
PG_DROP = [
    "DROP TRIGGER IF EXISTS hx_refuse ON {table}",
    "DROP FUNCTION IF EXISTS hx_refuse_leaving_running()",
]
MY_CREATE = [
    """
    CREATE TRIGGER hx_refuse BEFORE UPDATE ON {table} FOR EACH ROW
    BEGIN
        IF OLD.status = 'RUNNING' AND NEW.status <> 'RUNNING' THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'hx: the test refuses leaving RUNNING';
        END IF;
    END
    """
]
MY_DROP = ["DROP TRIGGER IF EXISTS hx_refuse"]
LITE_CREATE = [
    """
    CREATE TRIGGER hx_refuse BEFORE UPDATE ON {table} FOR EACH ROW
    WHEN OLD.status = 'RUNNING' AND NEW.status <> 'RUNNING'
    BEGIN SELECT RAISE(ABORT, 'hx: the test refuses leaving RUNNING'); END
    """
]
LITE_DROP = ["DROP TRIGGER IF EXISTS hx_refuse"]


def _sql(alias: str, statements: list[str]) -> None:
    connection = connections[alias]
    table = connection.ops.quote_name(QueuedTask._meta.db_table)
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement.format(table=table))


def _trigger(alias: str, *, outcomes_only: bool = False) -> tuple[list[str], list[str]]:
    """The trigger refusing every update out of ``RUNNING``; with ``outcomes_only``, only to an outcome (a give-back
    to ``READY`` passes)."""
    vendor = connections[alias].vendor
    create, drop = {
        "postgresql": (PG_CREATE, PG_DROP),
        "mysql": (MY_CREATE, MY_DROP),
        "sqlite": (LITE_CREATE, LITE_DROP),
    }[vendor]
    if outcomes_only:
        create = [
            s.replace("NEW.status <> 'RUNNING'", "NEW.status IN ('SUCCESSFUL', 'FAILED')") for s in create
        ]
    return create, drop


@pytest.mark.parametrize("alias", vendor_aliases())
@pytest.mark.parametrize(
    ("concurrency", "batch", "max_attempts", "task"),
    [
        (2, 3, 1, "noop"),
        (2, 3, 3, "value"),
        (1, 1, 1, "value"),
    ],
    ids=["c2-b3-max1-noop", "c2-b3-max3-value", "c1-b1-max1-value"],
)
def test_outcome_and_release_refused_then_accepted(
    alias: str, concurrency: int, batch: int, max_attempts: int, task: str
) -> None:
    create, drop = _trigger(alias)
    lease = 1
    with backend_on(alias, lease=lease, max_attempts=max_attempts, retry_backoff=0.01) as backend:
        job: Any = jobs.noop_task if task == "noop" else jobs.calculate_meaning_of_life
        results = [job.enqueue() for _ in range(4)]
        worker = Worker(
            backend, queues=sorted(backend.queues), worker_id="hx", concurrency=concurrency, batch=batch
        )
        outcome: list[Stats | BaseException] = []

        def run() -> None:
            try:
                outcome.append(worker.run())
            except BaseException as failure:
                outcome.append(failure)
            finally:
                connections.close_all()

        _sql(alias, create)
        thread = threading.Thread(target=run)
        thread.start()
        refused_for = 3.0  # three leases
        try:
            time.sleep(refused_for)  # every outcome and every give-back refused meanwhile
            during = sorted(QueuedTask.objects.using(alias).values_list("status", flat=True))
            _sql(alias, drop)
            started = time.monotonic()
            wait_for(
                lambda: (
                    not QueuedTask.objects.using(alias)
                    .exclude(status__in=(TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED))
                    .exists()
                ),
                timeout=40,
                what="every task in a final state once the database accepts writes",
            )
            settled_after = time.monotonic() - started
        finally:
            _sql(alias, drop)
            worker.stop()
            thread.join(timeout=60)
        final = {}
        for result in results:
            read = backend.get_result(result.id)
            final[result.id] = (
                str(read.status),
                read.worker_ids,
                [e.exception_class_path.rsplit(".", 1)[-1] for e in read.errors],
            )
    assert not thread.is_alive(), "the worker did not stop within 60s"
    assert not isinstance(outcome[0], BaseException), outcome
    print(f"during refusal: {during}; settled {settled_after:.1f}s after; stats {outcome[0]}")
    for key, value in final.items():
        print(key, value)
    assert all(len(workers) <= max_attempts + 1 for _, workers, _ in final.values()), final


@pytest.mark.parametrize("alias", vendor_aliases())
def test_a_burst_worker_gives_back_a_task_it_gave_up_before_it_exits(alias: str) -> None:
    from lockkit_tests.tasks.helpers import run_worker

    create, drop = _trigger(alias, outcomes_only=True)
    with backend_on(alias, lease=1, max_attempts=3) as backend:
        result = jobs.noop_task.enqueue()
        _sql(alias, create)
        try:
            stats = run_worker(backend, worker_id="hx-burst")
            row = QueuedTask.objects.using(alias).get(pk=result.id)
            left = (str(row.status), row.claimed_by, row.lease_expires_at is not None)
        finally:
            _sql(alias, drop)
    print(stats, left)
    # Before the fix the worker logged "giving it back to run again", then exited with the row RUNNING under its
    # claim until the lease ended (30 s by default). It gives it back at exit now: READY, its lease ended.
    assert (left[0], left[2]) == ("READY", False), (stats, left)
