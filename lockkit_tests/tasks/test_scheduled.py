"""An idle worker starts a scheduled task (``run_after``) at its time, not up to a ``poll_interval`` later.

Before, an idle worker looked again only every ``poll_interval`` (default 1 s; ``NOTIFY`` wakes it at an enqueue,
not when a task enqueued earlier becomes due): a task due in 5 s ran up to a whole interval late.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.tasks import TaskResultStatus
from django.utils import timezone

from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, status_of, vendor_aliases, wait_for, worker_process

POSTGRESQL, MARIADB, _SQLITE = vendor_aliases(apps=APPS)
#: Far longer than the test: a worker that waited it out would fail the test's timeout.
POLL = 120
#: Seconds from the enqueue to the scheduled task's time, per round (a round is run again when its worker started late).
MARGINS = (6, 15, 40)


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
        # The worker must be idle before the scheduled task is due, else the test would prove nothing. A slow start
        # on a loaded machine can eat the margin (over 6 s once): then the round is run again with a longer one.
        # The tasks are enqueued before the worker starts: on MariaDB nothing wakes an idle worker at an enqueue.
        for margin in MARGINS:
            due = timezone.now() + timedelta(seconds=margin)
            scheduled = jobs.echo.using(run_after=due).enqueue("due")
            now = jobs.echo.enqueue("now")
            with worker_process(alias, "--worker-id", "timely", options=opts, env=env) as worker:
                wait_for(succeeded(now), what="the task due at once")
                if timezone.now() >= due and margin != MARGINS[-1]:
                    continue  # the worker started too late: killed on leaving the block, and a longer round
                assert timezone.now() < due, worker.log()
                assert status_of(scheduled) == TaskResultStatus.READY
                wait_for(
                    succeeded(scheduled),
                    timeout=30,
                    what="the due task",
                )
                worker.signal(signal.SIGTERM)
                code, output = worker.wait()
            break
        assert code == 0, output
        assert f"idle poll {POLL}s" in output
        scheduled.refresh()
        assert scheduled.started_at is not None
        assert scheduled.started_at >= due  # never early
        assert scheduled.return_value == {"args": ["due"], "kwargs": {}}


def succeeded(result: Any) -> Callable[[], bool]:
    """A condition for ``wait_for``: ``result`` has succeeded."""
    return lambda: status_of(result) == TaskResultStatus.SUCCESSFUL
