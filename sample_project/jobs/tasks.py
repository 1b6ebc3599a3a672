"""The job queue on Django 6's Tasks API: each submitted job is a ``lockkit.tasks`` task run by ``lockkit_worker``.

Django 6 only (``django.tasks``); ``submit()`` creates the job row and enqueues its task in one transaction, and the
task marks the job done and logs its run inside ``lockkit.tasks.fenced()``: exactly once, whatever the workers do.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.tasks import task
from django.utils import timezone

from lockkit.tasks import current_claim, fenced
from sample_project.jobs.models import Job, JobRun


@task()
def run_job(job_id: int) -> dict[str, Any]:
    """Do the job (here: nothing slow), then record it done and its run, fenced by the task's claim."""
    claim = current_claim()
    with fenced() as scope:
        Job.objects.using(scope.alias).filter(pk=job_id).update(
            state=Job.State.DONE, result={"worker": claim.worker}, finished_at=timezone.now()
        )
        JobRun.objects.using(scope.alias).create(job_id=job_id, worker=claim.worker, token=claim.token)
    return {"job": job_id, "worker": claim.worker}


def submit(name: str, payload: dict[str, Any]) -> Job:
    """Create a job and enqueue its task, both or neither (the enqueue joins this transaction)."""
    with transaction.atomic():
        job = Job.objects.create(name=name, payload=payload)
        run_job.enqueue(job.pk)
    return job
