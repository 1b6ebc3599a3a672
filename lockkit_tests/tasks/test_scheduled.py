"""An idle worker starts a scheduled task (``run_after``) at its time, not up to a ``poll_interval`` later.

Before, an idle worker looked again only every ``poll_interval`` (default 1 s; ``NOTIFY`` wakes it at an enqueue,
not when a task enqueued earlier becomes due): a task due in 5 s ran up to a whole interval late.
"""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.tasks import TaskResultStatus
from django.utils import timezone

from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, status_of, vendor_aliases, wait_for, worker_process

POSTGRESQL, MARIADB, _SQLITE = vendor_aliases(apps=APPS)
#: Far longer than the test: a worker that waited it out would fail the test's timeout.
POLL = 120


@pytest.mark.parametrize("alias", [POSTGRESQL, MARIADB])
def test_an_idle_worker_starts_a_scheduled_task_at_its_time(alias: str) -> None:
    _starts_at_its_time(alias)


@pytest.mark.parametrize("alias", [MARIADB])
def test_a_mariadb_session_in_another_time_zone_does_not_delay_it(alias: str) -> None:
    """Due is read by the claim's own clock (UTC), not the session's ``NOW()``: a review found the task 22.6 s late
    with ``time_zone = '+05:00'``."""
    _starts_at_its_time(alias, session="SET time_zone = '+05:00'")


def _starts_at_its_time(alias: str, session: str = "") -> None:
    opts = {"lease": 5, "max_attempts": 1, "poll_interval": POLL}
    env = {"LOCKKIT_TEST_MYSQL_INIT_COMMAND": session} if session else None
    with backend_on(alias, **opts):
        due = timezone.now() + timedelta(seconds=6)
        scheduled = jobs.echo.using(run_after=due).enqueue("due")
        now = jobs.echo.enqueue("now")
        with worker_process(alias, "--worker-id", "timely", options=opts, env=env) as worker:
            wait_for(lambda: status_of(now) == TaskResultStatus.SUCCESSFUL, what="the task due at once")
            # Idle before the scheduled task is due (else this test would prove nothing).
            assert timezone.now() < due, worker.log()
            assert status_of(scheduled) == TaskResultStatus.READY
            wait_for(
                lambda: status_of(scheduled) == TaskResultStatus.SUCCESSFUL, timeout=30, what="the due task"
            )
            worker.signal(signal.SIGTERM)
            code, output = worker.wait()
        assert code == 0, output
        assert f"idle poll {POLL}s" in output
        scheduled.refresh()
        assert scheduled.started_at is not None
        assert scheduled.started_at >= due  # never early
        assert scheduled.return_value == {"args": ["due"], "kwargs": {}}
