"""A server down when the worker starts: waited out, or, for a drain (``--burst``), a non-zero exit.

Found by a hostile review (MariaDB, Django 6.1): the worker's start asked the server (Django's system checks of
every alias's fields, then the claims statements' server version) and stopped with a raw ``OperationalError``
traceback, although docs/tasks.md says a server that is down at start is waited out. And a new user's trial: a
``--burst`` drain against an unreachable database retried for ever instead of failing.
"""

from __future__ import annotations

import signal

import pytest
from django.tasks import TaskResultStatus

from lockkit_tests.support.faultkit import proxied
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, status_of, wait_for, worker_process

pytestmark = [
    pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON),
    pytest.mark.django_db(
        transaction=True, databases=["default", "mariadb", "proxied_mariadb"], available_apps=APPS
    ),
]


def test_a_server_down_at_start_is_waited_out_and_a_drain_exits_non_zero() -> None:
    with backend_on("mariadb"):
        result = jobs.calculate_meaning_of_life.enqueue()
    with proxied("mariadb", "proxied_mariadb") as (alias, proxy):
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
            with backend_on("mariadb"):
                wait_for(
                    lambda: status_of(result) == TaskResultStatus.SUCCESSFUL, timeout=30, what="the task"
                )
            worker.signal(signal.SIGTERM)
            code, log = worker.wait()
            assert code == 0, log
