"""A server restart under a running worker process: every task still ends SUCCESSFUL, its effect written once.

The server is a throwaway cluster this test starts (``initdb`` + ``pg_ctl`` on a free port, never the machine's
server), restarted with ``pg_ctl restart -m fast`` while ``lockkit_worker --concurrency 2`` works through the
queue: claims, heartbeats and completions meet terminated sessions and refused connections.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections
from django.tasks import TaskResultStatus

from lockkit.tasks.models import QueuedTask
from lockkit_harness.cluster import TempCluster, missing_binaries
from lockkit_tests.models import Owner
from lockkit_tests.support.faultkit import create_tables, extra_alias
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, wait_for, worker_process

MISSING = missing_binaries()
ALIAS = "restartable"
TASKS = 40

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=f"no throwaway cluster: {MISSING}"),
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS], available_apps=APPS),
]


@pytest.fixture
def cluster() -> Iterator[TempCluster]:
    with TempCluster(prefix="lockkit-tasks-") as started:
        with extra_alias(ALIAS, "default", HOST="127.0.0.1", PORT=started.port, NAME="postgres", OPTIONS={}):
            create_tables(ALIAS, QueuedTask, Owner)
            yield started
            connections[ALIAS].close()


def test_restart_under_a_running_worker(cluster: TempCluster) -> None:
    alias = ALIAS
    with backend_on(alias, lease=3, max_attempts=3):
        results = [jobs.fenced_effect.enqueue(f"restart-{n}") for n in range(TASKS)]
        connections[alias].close()
        with worker_process(
            alias,
            "--concurrency",
            "2",
            "--burst",
            "--worker-id",
            "survivor",
            options={"lease": 3, "max_attempts": 3},
        ) as worker:
            wait_for(lambda: Owner.objects.using(alias).count() >= 5, what="the worker to get going")
            connections[alias].close()
            took = cluster.restart("fast")
            assert took > 0
            code, output = worker.wait(timeout=60)
        assert code == 0, output
        statuses = QueuedTask.objects.using(alias).values_list("status", flat=True)
        assert sorted(set(statuses)) == [TaskResultStatus.SUCCESSFUL]
        names = sorted(Owner.objects.using(alias).values_list("name", flat=True))
        assert names == sorted(f"restart-{n}" for n in range(TASKS))  # each effect exactly once
        assert len(results) == TASKS
