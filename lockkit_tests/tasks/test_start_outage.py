"""A server down when the worker starts, or lost by a drain: waited out, or, for a drain (``--burst``), exit 1.

Found by a hostile review (MariaDB, Django 6.1): the worker's start asked the server (Django's system checks of
every alias's fields, then the claims statements' server version) and stopped with a raw ``OperationalError``
traceback, although docs/tasks.md says a server that is down at start is waited out. And a new user's trial: a
``--burst`` drain against an unreachable database retried for ever instead of failing; and a drain that lost
the server midway (its claims failing) retried for ever too.
"""

from __future__ import annotations

import signal
from contextlib import ExitStack
from pathlib import Path

import pytest
from django.tasks import TaskResultStatus

from lockkit_tests.support.faultkit import proxied
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, marker, status_of, wait_for, worker_process

ON_MARIADB = pytest.mark.django_db(
    transaction=True, databases=["default", "mariadb", "proxied_mariadb"], available_apps=APPS
)
MARIADB = pytest.param(
    ("mariadb", "proxied_mariadb"),
    id="mariadb",
    marks=[pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON), ON_MARIADB],
)
# A new user's trial on PostgreSQL: nothing of the worker's set-up asks PostgreSQL (MariaDB's asks its version), so
# its first statement (the claims held under its name) met the down server and the command died with a raw
# OperationalError traceback, exit 1, within a second.
POSTGRESQL = pytest.param(
    ("default", "proxied"),
    id="postgresql",
    marks=pytest.mark.django_db(transaction=True, databases=["default", "proxied"], available_apps=APPS),
)


@pytest.mark.parametrize("aliases", [POSTGRESQL, MARIADB])
def test_a_server_down_at_start_is_waited_out_and_a_drain_exits_non_zero(aliases: tuple[str, str]) -> None:
    database, through = aliases
    with backend_on(database):
        result = jobs.calculate_meaning_of_life.enqueue()
    with proxied(database, through) as (alias, proxy):
        proxy.refuse_new = True  # the server is down: every connection is refused
        with worker_process(alias, "--burst") as drain:
            code, log = drain.wait(timeout=60)
        assert code == 1, log
        assert "--burst: the database cannot be reached" in log
        assert "Traceback" not in log
        with worker_process(alias) as worker:
            wait_for(lambda: "cannot be reached, trying again" in worker.log(), what="the worker to wait")
            assert worker.process.poll() is None
            proxy.refuse_new = False  # the server is back
            with backend_on(database):
                wait_for(
                    lambda: status_of(result) == TaskResultStatus.SUCCESSFUL, timeout=30, what="the task"
                )
            worker.signal(signal.SIGTERM)
            code, log = worker.wait()
            assert code == 0, log
            assert "Traceback" not in log


@pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON)
@ON_MARIADB
def test_a_drain_that_loses_the_server_midway_exits_non_zero_and_leaves_the_rest_to_run(
    tmp_path: Path,
) -> None:
    started = marker(tmp_path, "first")
    with backend_on("mariadb"):
        first = jobs.slow.enqueue(started, 0.5)
        rest = [jobs.calculate_meaning_of_life.enqueue() for _ in range(3)]
    with proxied("mariadb", "proxied_mariadb") as (alias, proxy):
        with worker_process(alias, "--burst") as drain:
            wait_for(lambda: Path(started + ".started").exists(), what="the first task to start")
            proxy.refuse_new = True  # the server is gone for the rest of the drain
            proxy.cut_all()
            code, log = drain.wait(timeout=90)
        assert code == 1, log
        assert "--burst: the drain stopped, claiming failed" in log
        assert "Traceback" not in log
    with backend_on("mariadb"):
        # None of the rest was claimed: the next drain runs them (the first one's claim ends with its lease).
        assert [status_of(result) for result in rest] == [TaskResultStatus.READY] * 3
        assert status_of(first) == TaskResultStatus.RUNNING


@pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON)
@ON_MARIADB
@pytest.mark.parametrize(
    ("number", "ignored"),
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGINT, True)],
    ids=["SIGTERM", "SIGINT", "SIGINT-ignored-by-its-parent"],
)
def test_a_signal_while_the_worker_waits_for_the_server_stops_it_cleanly(number: int, ignored: bool) -> None:
    # Found by a new user's trial: Ctrl-C while the worker waited printed a KeyboardInterrupt traceback, and
    # SIGTERM ended it with status 143 (the default action), where a running worker exits 0. Started with SIGINT
    # ignored (a background job of a shell without job control), it went on waiting: a running worker stops on it.
    with proxied("mariadb", "proxied_mariadb") as (alias, proxy):
        proxy.refuse_new = True
        with ExitStack() as stack:
            inherited = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignored else None
            try:
                worker = stack.enter_context(worker_process(alias))
            finally:
                if ignored:
                    signal.signal(signal.SIGINT, inherited)
            wait_for(lambda: "cannot be reached, trying again" in worker.log(), what="the worker to wait")
            worker.signal(number)
            code, log = worker.wait()
        assert code == 0, log
        assert "stopped while waiting for the database" in log
        assert "Traceback" not in log
