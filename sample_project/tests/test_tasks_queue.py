"""The job queue on lockkit.tasks (Django 6): submitted jobs run once each under ``manage.py lockkit_worker``."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction
from django.tasks import TaskResultStatus

from lockkit.tasks.models import QueuedTask
from sample_project.jobs.models import Job, JobRun
from sample_project.jobs.tasks import submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_submitted_jobs_run_exactly_once_under_lockkit_worker() -> None:
    jobs = [submit("send-receipt", {"order": n}) for n in range(20)]
    out = StringIO()
    call_command("lockkit_worker", "--burst", "--concurrency", "2", "--claim-batch", "5", stdout=out)
    assert "20 succeeded, 0 failed" in out.getvalue()
    assert set(Job.objects.values_list("state", flat=True)) == {Job.State.DONE}
    assert sorted(JobRun.objects.values_list("job_id", flat=True)) == sorted(job.pk for job in jobs)
    assert set(QueuedTask.objects.values_list("status", flat=True)) == {TaskResultStatus.SUCCESSFUL}


class Abort(Exception):
    pass


def _submit_then_abort() -> None:
    with transaction.atomic():
        submit("send-receipt", {"order": 1})
        raise Abort


def test_a_rolled_back_submission_leaves_no_task() -> None:
    with pytest.raises(Abort):
        _submit_then_abort()
    assert not Job.objects.exists()
    assert not QueuedTask.objects.exists()


@pytest.mark.contention
def test_the_demo_task_queue_survives_a_worker_killed_mid_task() -> None:
    """The demo's job queue on Django 6: lockkit_worker processes, one SIGKILLed mid-task, audited in the database."""
    from django.db import connections

    from sample_project.demo.bootstrap import url_of
    from sample_project.demo.task_queue import broken, run_task_queue
    from sample_project.demo.task_report import task_queue_table

    seen: list[int] = []
    result = run_task_queue(
        url_of(connections["default"].settings_dict), 20, workers=3, progress=seen.append, lease=1.0
    )
    assert broken(result) == []
    assert (result.succeeded, result.done, result.run_twice, result.lost) == (20, 20, 0, 0)
    # The killed worker's task was claimed again once its lease ran out: two attempts, both counted.
    assert result.killed.startswith("demo-worker-")
    assert len(result.victim_workers) == 2
    assert result.victim_workers[0] == result.killed
    assert result.victim_workers[1] != result.killed
    assert result.attempts == 21
    assert result.exit_codes == (0, 0)  # the survivors stopped cleanly on SIGTERM
    assert seen[-1] == 20
    assert JobRun.objects.count() == 20
    assert set(QueuedTask.objects.values_list("status", flat=True)) == {TaskResultStatus.SUCCESSFUL}
    from rich.console import Console

    console = Console(file=StringIO(), width=120)
    console.print(task_queue_table(result))
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert "attempt 2 of 2" in output
    assert "sample_project/jobs/tasks.py" in output
