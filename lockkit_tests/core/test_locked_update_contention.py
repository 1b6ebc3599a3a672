"""``locked_update`` from many processes on one row: no lost update, each decrement committed exactly once.

Worker processes (``spawn``: their connections are their own) decrement one ``Stock`` row together; each call
returns the value it wrote. Every value from the initial one down is written by exactly one call, and the row ends
at the initial value minus the number of calls. The sessions really queued on the row: a lock-wait monitor sees them
on PostgreSQL; on MariaDB, whose InnoDB lock views refresh too slowly for waits of a few milliseconds, the server's
count of row lock waits grows.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
from typing import Any

import pytest
from django.db import connections

from lockkit.testing import LockWaitMonitor
from lockkit_tests.models import Stock
from lockkit_tests.support.update_worker import decrement
from lockkit_tests.support.vendors import vendor_params

JOIN = 60.0
# (processes, calls each): PostgreSQL sends two messages a call; MariaDB runs a locked scope (more round trips).
LOAD = {"default": (8, 25), "mariadb": (4, 15)}
INITIAL = 1000

pytestmark = pytest.mark.contention


@pytest.mark.parametrize("alias", vendor_params())
def test_processes_decrementing_one_row_lose_no_update(alias: str) -> None:
    processes, calls = LOAD[alias]
    Stock.objects.using(alias).create(sku="widget", available=INITIAL)
    waits_before = _row_lock_waits(alias)
    names = {name: str(connections[name].settings_dict["NAME"]) for name in ("default", alias)}
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(processes + 1)
    results: Any = context.Queue()
    workers = [
        context.Process(target=decrement, args=(names, alias, "widget", calls, start, results), daemon=True)
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    reports: dict[int, Any] = {}
    try:
        with LockWaitMonitor(alias, interval=0.005) as monitor:
            start.wait(JOIN)  # every worker has set Django up and opened nothing yet: they start together
            for _ in workers:
                pid, report = results.get(timeout=JOIN)
                reports[pid] = report
    except (queue.Empty, threading.BrokenBarrierError) as exc:
        raise AssertionError(f"the workers did not finish within {JOIN}s: {reports}") from exc
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
    assert all(worker.exitcode == 0 for worker in workers)
    failed = {pid: report for pid, report in reports.items() if not isinstance(report, list)}
    assert failed == {}
    written = sorted(value for values in reports.values() for value in values)
    total = processes * calls
    # Each value from INITIAL - 1 down to INITIAL - total written by exactly one call: no two calls decided on the
    # same row value (a lost update), none committed twice.
    assert written == list(range(INITIAL - total, INITIAL))
    for values in reports.values():
        assert len(values) == calls
        assert values == sorted(values, reverse=True)  # one process's calls see their own earlier writes
    assert Stock.objects.using(alias).get(sku="widget").available == INITIAL - total
    if alias == "mariadb":
        assert _row_lock_waits(alias) > waits_before  # server-wide (other clients count too): a weaker sign
    else:
        assert monitor.peak() >= 2  # the sessions really queued behind the row lock


def _row_lock_waits(alias: str) -> int:
    """MariaDB's ``Innodb_row_lock_waits`` (row lock waits since the server started); 0 elsewhere."""
    if connections[alias].vendor != "mysql":
        return 0
    with connections[alias].cursor() as cursor:
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_waits'")
        row = cursor.fetchone()
    assert row is not None
    return int(row[1])
