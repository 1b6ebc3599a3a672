"""Enqueue's kept cursor (``lockkit._engine.cursors``) and its remembered task checks, on each vendor.

One driver cursor serves a thread's enqueues on an alias while its connection and Django's query logging stay
the same; a statement of a hook nested inside gets its own; a connection the server ended is replaced and the
next enqueue works; a setting change makes the task checks run again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest
from django.db import connections
from django.tasks.exceptions import InvalidTask
from django.test.utils import CaptureQueriesContext, override_settings

from lockkit.tasks.models import QueuedTask
from lockkit_harness import sessions
from lockkit_tests.support.util import run_threads
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, vendor_aliases


def _cursors(seen: list[Any]) -> Callable[..., Any]:
    """An ``execute_wrapper`` recording each enqueue's driver cursor (kept alive: no id is reused).

    Only the ``INSERT``: a vendor may read something of the server once per connection first (MariaDB).
    """

    def wrapper(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        if "INSERT" in sql:
            seen.append(context["cursor"].cursor)
        return execute(sql, params, many, context)

    return wrapper


def _stored(alias: str, *results: Any) -> list[Any]:
    """The stored ``args`` of each result's row, in order (``None`` for a row that does not exist)."""
    rows = {row.pk: row for row in QueuedTask.objects.using(alias).all()}
    return [rows[UUID(r.id)].args_kwargs["args"] if UUID(r.id) in rows else None for r in results]


@pytest.mark.parametrize("alias", vendor_aliases())
def test_enqueues_of_a_thread_share_one_cursor_and_each_is_logged_when_logging_is_on(alias: str) -> None:
    connection = connections[alias]
    seen: list[Any] = []
    with backend_on(alias):
        with connection.execute_wrapper(_cursors(seen)):
            first = [jobs.noop_task.enqueue(n) for n in range(3)]
        assert len(seen) == 3
        assert seen[1] is seen[0]
        assert seen[2] is seen[0]
        with CaptureQueriesContext(connection) as queries:  # logging on: a cursor that logs
            logged = jobs.noop_task.enqueue(3)
        assert [("INSERT" in q["sql"]) for q in queries] == [True]
        logged_so_far = len(connection.queries_log)
        unlogged = jobs.noop_task.enqueue(4)  # logging off again: the kept cursor does not log
        assert len(connection.queries_log) == logged_so_far
    assert _stored(alias, *first, logged, unlogged) == [[0], [1], [2], [3], [4]]


@pytest.mark.parametrize("alias", vendor_aliases())
def test_an_enqueue_from_a_hook_inside_an_enqueue_gets_its_own_cursor(alias: str) -> None:
    connection = connections[alias]
    inner: list[Any] = []
    seen: list[Any] = []

    def hook(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if "INSERT" not in sql:
            return execute(sql, params, many, context)
        seen.append(context["cursor"].cursor)
        if not inner:  # an audit hook that enqueues a task of its own, once
            inner.append(None)
            inner.append(jobs.noop_task.enqueue("audit"))
        return execute(sql, params, many, context)

    with backend_on(alias), connection.execute_wrapper(hook):
        outer = jobs.noop_task.enqueue("order")
        after = jobs.noop_task.enqueue("next")
    # The outer statement's cursor, the nested one's (its own), the outer again, then the kept one once more.
    assert len(seen) == 3
    assert seen[1] is not seen[0]
    assert seen[2] is seen[0]
    assert _stored(alias, outer, inner[1], after) == [["order"], ["audit"], ["next"]]


@pytest.mark.parametrize("alias", vendor_aliases()[:1])
def test_after_the_server_ends_the_idle_session_the_next_enqueue_works_on_a_new_cursor(alias: str) -> None:
    connection = connections[alias]
    seen: list[Any] = []
    with backend_on(alias), connection.execute_wrapper(_cursors(seen)):
        before = jobs.noop_task.enqueue("before")
        pid = sessions.session_of(alias)
        assert sessions.terminate(alias, pid)
        # The server's farewell waits on the idle connection's socket: the connection is replaced before the
        # INSERT is sent, rather than the INSERT sent into the ended session (and refused).
        after = jobs.noop_task.enqueue("after")
        assert connection.connection.info.backend_pid != pid
    assert seen[-1] is not seen[0]
    assert seen[-1].connection is connection.connection
    assert QueuedTask.objects.using(alias).count() == 2
    assert _stored(alias, before, after) == [["before"], ["after"]]


@pytest.mark.parametrize("alias", vendor_aliases()[:2])
def test_threads_enqueue_on_their_own_connections_and_cursors(alias: str) -> None:
    found: dict[int, tuple[Any, list[Any], list[Any]]] = {}
    errors: list[BaseException] = []

    def enqueue(number: int) -> None:
        seen: list[Any] = []
        try:
            connection = connections[alias]
            with connection.execute_wrapper(_cursors(seen)):
                results = [jobs.noop_task.enqueue(number * 100 + n) for n in range(20)]
            found[number] = (connection.connection, seen, results)
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connections.close_all()

    with backend_on(alias):
        run_threads(enqueue, 2)
    assert errors == []
    (raw_a, seen_a, results_a), (raw_b, seen_b, results_b) = found[0], found[1]
    assert raw_a is not raw_b
    assert all(cursor is seen_a[0] for cursor in seen_a)
    assert all(cursor is seen_b[0] for cursor in seen_b)
    assert seen_a[0] is not seen_b[0]
    assert _stored(alias, *results_a, *results_b) == [[n] for n in range(20)] + [[100 + n] for n in range(20)]


@pytest.mark.parametrize("alias", vendor_aliases()[:1])
def test_a_task_checked_once_is_checked_again_after_installed_apps_change(alias: str) -> None:
    with backend_on(alias):
        jobs.noop_task.enqueue(1)
        without_tests = ["django.contrib.contenttypes", "lockkit", "lockkit.tasks"]
        with (
            override_settings(INSTALLED_APPS=without_tests),
            pytest.raises(InvalidTask, match="INSTALLED_APPS"),
        ):
            jobs.noop_task.enqueue(2)  # the task's module is no longer an installed app's
        jobs.noop_task.enqueue(3)
    assert sorted(row.args_kwargs["args"] for row in QueuedTask.objects.using(alias).all()) == [[1], [3]]
