"""PostgreSQL: the worker's claim reaches the next task through the partial index of unfinished tasks, as the
generic plan of a prepared statement too.

The worker prepares its claim (the same text every time), and PostgreSQL switches a prepared statement to a generic
plan, made without the parameters' values, once that plan looks no costlier than the custom ones: it does so after
a burst of enqueues into a table whose statistics still call it small. Before, the partial index's predicate was
``status IN ('READY', 'RUNNING')``, which a generic plan cannot prove from the claim's ``status IN ($1, $2)``: every
claim read and sorted the whole table (one worker ran 98 tasks/s with 20,000 waiting, 1,143 with this index).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.db import IntegrityError, connections, transaction
from django.db.migrations.autodetector import MigrationAutodetector
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState
from django.tasks import TaskResultStatus
from django.utils import timezone

from lockkit.claims.sql import claims_sql_for
from lockkit.tasks.models import QueuedTask
from lockkit.tasks.worker import Worker
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, run_worker, vendor_aliases

PG = "default"


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_plan_nodes(child))
    return nodes


@pytest.mark.django_db(transaction=True, available_apps=APPS)
def test_the_claim_s_generic_plan_reads_the_partial_index_of_unfinished_tasks() -> None:
    now = timezone.now()
    with backend_on(PG) as backend:
        finished = [
            QueuedTask(
                backend_name="default", queue_name="default", task_path="lockkit_tests.tasks.jobs.noop_task",
                args_kwargs={"args": [], "kwargs": {}}, enqueued_at=now - timedelta(hours=1),
                status=TaskResultStatus.SUCCESSFUL, finished_at=now - timedelta(minutes=30),
            )
            for _ in range(3000)
        ]  # fmt: skip
        QueuedTask.objects.using(PG).bulk_create(finished)
        worker = Worker(backend, queues=sorted(backend.queues), worker_id="plan")
        # The pick of the worker's own claim: its candidates, claimable, in claim order, as NextClaims compiles it.
        picked = claims_sql_for(QueuedTask, PG).picked_pks(worker._claims.ordered, 1, None)
        assert picked is not None
        sql, params = picked
        numbered = iter(range(1, len(params) + 1))
        prepared = re.sub(r"%s", lambda _: f"${next(numbered)}", sql)
        with connections[PG].cursor() as cursor:
            cursor.execute(f"ANALYZE {QueuedTask._meta.db_table}")
            cursor.execute(f"PREPARE lockkit_test_pick AS {prepared}")
            try:
                cursor.execute("SET plan_cache_mode = force_generic_plan")
                placeholders = ", ".join(["%s"] * len(params))
                cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE lockkit_test_pick({placeholders})", params)
                (plan,) = cursor.fetchone()
            finally:
                cursor.execute("RESET plan_cache_mode")
                cursor.execute("DEALLOCATE lockkit_test_pick")
    nodes = _plan_nodes((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])
    scans = {(node["Node Type"], node.get("Index Name")) for node in nodes if "Relation Name" in node}
    assert scans == {("Index Scan", "lockkit_tasks_unfinished_idx")}, plan
    assert not [node for node in nodes if node["Node Type"] == "Sort"], plan


@pytest.mark.parametrize("alias", vendor_aliases())
def test_a_finished_task_set_back_to_ready_by_hand_must_drop_its_finish_time(alias: str) -> None:
    """Workers find unfinished tasks by ``finished_at IS NULL``: the database refuses a ``READY`` row that keeps one
    (it would never run), and a task set back properly runs again."""
    with backend_on(alias, max_attempts=1) as backend:
        result = jobs.echo.enqueue(7)
        assert run_worker(backend).succeeded == 1
        row = QueuedTask.objects.using(alias).filter(pk=result.id)
        assert row.get().finished_at is not None
        for status in (TaskResultStatus.READY, TaskResultStatus.RUNNING):
            with pytest.raises(IntegrityError), transaction.atomic(using=alias):
                row.update(status=status)
        assert row.get().status == TaskResultStatus.SUCCESSFUL
        # As new: no finish time, and no attempt (they are counted by worker_ids; max_attempts=1 here).
        reset = {"finished_at": None, "attempts": 0, "worker_log": ""}
        assert row.update(status=TaskResultStatus.READY, **reset) == 1
        assert run_worker(backend).succeeded == 1  # the next worker finds it
        again = row.get()
        assert (again.status, again.return_value) == (
            TaskResultStatus.SUCCESSFUL,
            {"args": [7], "kwargs": {}},
        )
        assert again.finished_at is not None


@pytest.mark.django_db(transaction=True, available_apps=APPS)
def test_migration_0005_clears_the_finish_time_of_a_task_set_back_to_ready_by_hand() -> None:
    """Upgrading: such a row ran before (workers claimed by status) and still runs; a finished one keeps its time."""
    connection = connections[PG]
    before = [("lockkit_tasks", "0004_queuedtask_finished_idx")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps.get_model("lockkit_tasks", "QueuedTask")
        now = timezone.now()
        common = {
            "backend_name": "default", "queue_name": "default", "task_path": "lockkit_tests.tasks.jobs.noop_task",
            "args_kwargs": {"args": [], "kwargs": {}}, "enqueued_at": now, "finished_at": now,
        }  # fmt: skip
        ready = old._default_manager.using(PG).create(status="READY", **common).pk
        failed = old._default_manager.using(PG).create(status="FAILED", **common).pk
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes("lockkit_tasks"))
    rows = QueuedTask.objects.using(PG)
    assert rows.get(pk=ready).finished_at is None
    assert rows.get(pk=failed).finished_at == now
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, QueuedTask._meta.db_table)
    assert {"lockkit_tasks_unfinished_idx", "lockkit_tasks_unfinished_not_finished"} <= set(found)
    assert "lockkit_tasks_todo_idx" not in found


def test_the_migrations_state_the_models() -> None:
    """The indexes and constraints the models declare are the migrations' (0005 moved one index out of Meta)."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    detector = MigrationAutodetector(loader.project_state(), ProjectState.from_apps(apps))
    changes = detector.changes(graph=loader.graph, trim_to_apps={"lockkit_tasks"})
    assert "lockkit_tasks" not in changes, changes


@pytest.mark.django_db(transaction=True, available_apps=APPS)
def test_an_idle_worker_reads_its_next_due_task_from_the_first_entry_of_an_index() -> None:
    """Not every scheduled task on every idle turn: a review measured 26 ms a turn at 100,000 of them (a minimum
    over an expression), where the first entry of ``lockkit_tasks_scheduled_idx`` in ``ready_at`` order is enough."""
    now = timezone.now()
    with backend_on(PG) as backend:
        scheduled = [
            QueuedTask(
                backend_name="default", queue_name="default", task_path="lockkit_tests.tasks.jobs.noop_task",
                args_kwargs={"args": [], "kwargs": {}}, enqueued_at=now, run_after=now + timedelta(hours=1 + i),
                ready_at=now + timedelta(hours=1 + i),
            )
            for i in range(2000)
        ]  # fmt: skip
        QueuedTask.objects.using(PG).bulk_create(scheduled)
        worker = Worker(backend, queues=sorted(backend.queues), worker_id="idle", poll_interval=7200)
        with connections[PG].cursor() as cursor:
            cursor.execute(f"ANALYZE {QueuedTask._meta.db_table}")
            cursor.execute("SET enable_seqscan = off")  # the plan an index allows, whatever the table's size
            try:
                plan = worker._scheduled[:1].explain(format="json")
            finally:
                cursor.execute("RESET enable_seqscan")
        assert 3500 < worker._idle_wait() <= 3600  # the first of them, due in an hour (the database clock)
    nodes = _plan_nodes(json.loads(plan)[0]["Plan"])
    scans = {(node["Node Type"], node.get("Index Name")) for node in nodes if "Relation Name" in node}
    assert scans == {("Index Scan", "lockkit_tasks_scheduled_idx")}, plan
    assert not [node for node in nodes if node["Node Type"] == "Sort"], plan


@pytest.mark.parametrize("alias", vendor_aliases())
def test_the_task_app_migrates_to_zero_and_back(alias: str) -> None:
    """``migrate lockkit_tasks zero`` works on every vendor (SQLite's rebuild for 0002 had dropped 0001's index),
    and migrating forward again makes the partial indexes where the database has them."""
    connection = connections[alias]
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes("lockkit_tasks")
    try:
        executor.migrate([("lockkit_tasks", None)])
        with connection.cursor() as cursor:
            tables = connection.introspection.table_names(cursor)
        assert QueuedTask._meta.db_table not in tables
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaves)
    with connection.cursor() as cursor:
        found = set(connection.introspection.get_constraints(cursor, QueuedTask._meta.db_table))
    partial = {"lockkit_tasks_unfinished_idx", "lockkit_tasks_scheduled_idx"}
    assert partial <= found if connection.features.supports_partial_indexes else not partial & found
    assert {"lockkit_tasks_finished_idx", "lockkit_tasks_status_idx"} <= found
    assert "lockkit_tasks_todo_idx" not in found
