"""Enqueueing: one statement per task, and a task table on another alias than the caller's transaction.

On PostgreSQL with two real databases (``default`` and ``other``, lockkit_tests/settings.py): the caller's
transaction is on ``default``, the task table on ``other``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from django.db import connections, transaction
from django.tasks import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import lockkit
from lockkit.tasks.models import QueuedTask
from lockkit.testing import hold_lock
from lockkit_tests.models import Stock
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, run_worker, vendor_aliases

TWO = pytest.mark.django_db(
    transaction=True,
    databases=["default", "other"],
    available_apps=["lockkit", "lockkit.tasks", "lockkit_tests"],
)


def _committed(alias: str) -> int:
    """How many task rows another session sees on ``alias`` (committed rows only)."""
    other = connections.create_connection(alias)
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT COUNT(*) FROM {other.ops.quote_name(QueuedTask._meta.db_table)}")
            row = cursor.fetchone()
            assert row is not None
            return int(row[0])
    finally:
        other.close()


class Abort(Exception):
    pass


@pytest.mark.parametrize("alias", vendor_aliases())
def test_enqueue_is_one_statement(alias: str) -> None:
    with backend_on(alias) as backend, CaptureQueriesContext(connections[alias]) as queries:
        result = jobs.noop_task.enqueue(1)
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert backend.get_result(result.id).args == [1]


@pytest.mark.parametrize("alias", vendor_aliases())
def test_enqueue_writes_the_columns_that_have_a_value_in_each_shape(alias: str) -> None:
    """A column without a value is left out of the INSERT (it is NULL); the statement is kept per set of columns,
    so tasks with and without ``run_after`` enqueued in turn in one process each get their own."""
    due = timezone.now() + timedelta(hours=1)
    with backend_on(alias) as backend, CaptureQueriesContext(connections[alias]) as queries:
        plain = jobs.noop_task.enqueue(1)
        later = jobs.noop_task.using(run_after=due).enqueue(2)
        again = jobs.noop_task.enqueue(3)
    statements = [q["sql"] for q in queries]
    assert len(statements) == 3, statements
    column = connections[alias].ops.quote_name("run_after")
    assert [column in sql for sql in statements] == [False, True, False], statements
    assert all(connections[alias].ops.quote_name("finished_at") not in sql for sql in statements), statements
    rows = {row.pk: row for row in QueuedTask.objects.using(alias).all()}
    assert [(rows[UUID(r.id)].run_after, rows[UUID(r.id)].ready_at) for r in (plain, again)] == [
        (None, None)
    ] * 2
    assert (rows[UUID(later.id)].run_after, rows[UUID(later.id)].ready_at) == (due, due)
    for result, value in ((plain, 1), (later, 2), (again, 3)):
        row = rows[UUID(result.id)]
        assert (row.status, row.errors, row.worker_log, row.attempts, row.finished_at) == (
            "READY",
            [],
            "",
            0,
            None,
        )
        assert backend.get_result(result.id).args == [value]


@TWO
def test_enqueue_inside_atomic_on_another_alias_waits_for_its_commit() -> None:
    with backend_on("other") as backend:
        with transaction.atomic(using="default"):
            result = jobs.noop_task.enqueue(7)
            assert _committed("other") == 0  # not before the caller commits
            with pytest.raises(TaskResultDoesNotExist):
                backend.get_result(result.id)
        assert _committed("other") == 1
        assert backend.get_result(result.id).args == [7]

        with pytest.raises(Abort), transaction.atomic(using="default"):
            jobs.noop_task.enqueue(8)
            raise Abort
        assert _committed("other") == 1  # the rolled-back caller's task never exists
        assert run_worker(backend).succeeded == 1
        assert backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


@TWO
def test_enqueue_inside_a_locked_operation_retried_after_a_lock_timeout_makes_one_task() -> None:
    Stock.objects.create(sku="A", available=1)
    attempts: list[int] = []

    @lockkit.locked_operation(using="default", lock_timeout=0.2)
    def order() -> None:
        scope = lockkit.current_scope()
        attempts.append(scope.attempt)
        jobs.noop_task.enqueue(scope.attempt)
        if scope.attempt == 1:
            scope.get(Stock, sku="A")  # held by another session: LockTimeout, retried

    with backend_on("other"), hold_lock(Stock.objects.filter(sku="A")):
        order()
    assert attempts == [1, 2]
    assert [row.args_kwargs["args"] for row in QueuedTask.objects.using("other")] == [[2]]
    with backend_on("other"):
        order()  # the next call works
    assert QueuedTask.objects.using("other").count() == 2


@pytest.mark.django_db(
    transaction=True,
    databases=["default", "other", "sqlite"],
    available_apps=["lockkit", "lockkit.tasks", "lockkit_tests"],
)
def test_enqueue_with_transactions_open_on_two_other_aliases_is_refused() -> None:
    with backend_on("other"):
        with transaction.atomic(using="default"), transaction.atomic(using="sqlite"):
            with pytest.raises(transaction.TransactionManagementError, match="'default', 'sqlite'"):
                jobs.noop_task.enqueue()
        assert _committed("other") == 0
        jobs.noop_task.enqueue()  # the next call works
    assert _committed("other") == 1


@TWO
def test_check_warns_about_a_task_table_on_another_alias() -> None:
    with backend_on("other") as backend:
        found: list[Any] = list(backend.check())
    assert [message.id for message in found] == ["lockkit.tasks.W001"]
    assert "'other'" in found[0].msg
    with backend_on("default") as backend:
        assert list(backend.check()) == []


@TWO
def test_enqueue_in_a_manual_transaction_joins_it_on_the_task_tables_alias() -> None:
    """Autocommit off on the task table's alias: the task commits or rolls back with the caller's transaction."""
    with backend_on("default"):
        transaction.set_autocommit(False)
        try:
            jobs.noop_task.enqueue()
            assert _committed("default") == 0  # not committed on its own
            transaction.rollback()
            assert _committed("default") == 0
            jobs.noop_task.enqueue()
            transaction.commit()
            assert _committed("default") == 1
        finally:
            transaction.set_autocommit(True)


@TWO
def test_enqueue_with_autocommit_off_on_another_alias_is_refused() -> None:
    """As Django's ``on_commit()``: a manual transaction elsewhere has no commit the insert could wait for."""
    with backend_on("other"):
        transaction.set_autocommit(False)
        try:
            connections["default"].ensure_connection()
            with pytest.raises(transaction.TransactionManagementError, match="autocommit off on 'default'"):
                jobs.noop_task.enqueue()
        finally:
            transaction.rollback()
            transaction.set_autocommit(True)
        assert _committed("other") == 0
        jobs.noop_task.enqueue()  # the next call works
    assert _committed("other") == 1
