"""A running worker whose server refuses its settings for a while (the role's ``LOGIN`` revoked, its sessions
ended, then ``LOGIN`` given back): it is not a start-up misconfiguration (``test_start_misconfigured.py``), the
worker waits it out as an outage, and the tasks enqueued meanwhile run once the server accepts it again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connections
from django.tasks import TaskResultStatus

from lockkit_tests.support.faultkit import extra_alias
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, marker, status_of, wait_for, worker_process


def _admin(sql: str, *params: str) -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute(sql, params)


@contextmanager
def _role() -> Iterator[str]:
    """A superuser role the worker logs in as (``default``'s tables are then its own to use); dropped after.

    Roles are the server's, not a database's: named after the test database, so two runs on one server never meet.
    """
    database = re.sub(r"\W", "_", str(connections["default"].settings_dict["NAME"])).lower()
    role = f"lockkit_refused_{database}"[:63]
    _admin(f"DROP ROLE IF EXISTS {role}")
    _admin(f"CREATE ROLE {role} LOGIN SUPERUSER")
    try:
        yield role
    finally:
        _admin(f"ALTER ROLE {role} LOGIN")
        _admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", role)
        wait_for(lambda: not _sessions_of(role), what="the role's sessions to end")
        _admin(f"DROP ROLE IF EXISTS {role}")


def _sessions_of(role: str) -> list[int]:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE usename = %s", [role])
        return [pid for (pid,) in cursor.fetchall()]


@pytest.mark.django_db(transaction=True, databases=["default", "restartable"], available_apps=APPS)
@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_a_running_worker_waits_out_a_login_refused_for_a_while_and_runs_what_was_enqueued(
    tmp_path: Path, concurrency: str
) -> None:
    with _role() as role, extra_alias("restartable", "default", USER=role, PASSWORD="") as alias:
        with (
            backend_on(alias, max_attempts=1),
            worker_process(
                alias, "--interval", "0.2", "--lease", "3", "--concurrency", concurrency
            ) as worker,
        ):
            # The worker has its settings (its environment); this process enqueues as the suite's own user.
            connections[alias].close()
            connections[alias].settings_dict["USER"] = connections["default"].settings_dict["USER"]
            first = jobs.calculate_meaning_of_life.enqueue()
            wait_for(lambda: status_of(first) == TaskResultStatus.SUCCESSFUL, what="the first task")
            wait_for(lambda: _sessions_of(role), what="the worker's sessions")
            _admin(f"ALTER ROLE {role} NOLOGIN")
            _admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", role)
            wait_for(lambda: not _sessions_of(role), what="the worker's sessions to end")
            during = jobs.slow.enqueue(marker(tmp_path, "during"), 0.0)
            # The worker has met the refusal (its heartbeat or its claims reconnect and are refused) ...
            wait_for(lambda: "is not permitted to log in" in worker.log(), what="the worker to be refused")
            # ... for longer than its lease (3 s, a beat a second) and its retry policy's reconnect_within (5 s)
            wait_for(lambda: worker.log().count("failed, retrying") >= 6, what="more refusals")
            wait_for(lambda: worker.log().count("heartbeat of") >= 4, what="beats refused for a lease")
            assert worker.process.poll() is None, worker.log()
            assert status_of(during) == TaskResultStatus.READY
            _admin(f"ALTER ROLE {role} LOGIN")
            wait_for(lambda: status_of(during) == TaskResultStatus.SUCCESSFUL, timeout=30, what="the task")
            assert worker.process.poll() is None, worker.log()
            assert len(during.worker_ids) == 1
            assert during.return_value == "slept"
            worker.signal(15)
            code, log = worker.wait(timeout=30)
        assert code == 0, log


@pytest.mark.django_db(transaction=True, databases=["default", "restartable"], available_apps=APPS)
def test_a_task_running_while_the_login_is_refused_is_recorded_once_it_is_back(tmp_path: Path) -> None:
    prefix = marker(tmp_path, "running")
    with _role() as role, extra_alias("restartable", "default", USER=role, PASSWORD="") as alias:
        with (
            backend_on(alias, max_attempts=1),
            worker_process(alias, "--interval", "0.2", "--lease", "20", "--concurrency", "2") as worker,
        ):
            connections[alias].close()
            connections[alias].settings_dict["USER"] = connections["default"].settings_dict["USER"]
            running = jobs.slow.enqueue(prefix, 3.0)
            wait_for(lambda: Path(prefix + ".started").exists(), what="the task to start")
            _admin(f"ALTER ROLE {role} NOLOGIN")
            _admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", role)
            wait_for(lambda: not _sessions_of(role), what="the worker's sessions to end")
            # The task ends while its worker cannot log in: its success cannot be written yet.
            wait_for(lambda: Path(prefix + ".done").exists(), what="the task to end")
            wait_for(lambda: "is not permitted to log in" in worker.log(), what="the worker to be refused")
            assert status_of(running) == TaskResultStatus.RUNNING
            _admin(f"ALTER ROLE {role} LOGIN")
            wait_for(lambda: status_of(running) != TaskResultStatus.RUNNING, timeout=30, what="the outcome")
            assert (running.status, running.worker_ids, running.errors) == (
                TaskResultStatus.SUCCESSFUL,
                [worker.log().split("lockkit_worker ", 1)[1].split(":", 1)[0]],
                [],
            )
            assert running.return_value == "slept"
            assert worker.process.poll() is None, worker.log()
