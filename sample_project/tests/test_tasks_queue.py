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
    call_command("lockkit_worker", "--burst", "--concurrency", "2", "--batch", "5", stdout=out)
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
