"""DO NOT COPY: the job queue the demo compares lockkit's claims against: no lock, no lease, no token.

Two workers that read the same pending job both mark it running and both run it. A worker that dies after
claiming leaves its job ``running`` for ever: nobody knows it was abandoned.
"""

from __future__ import annotations

from django.db.models.functions import Now

from sample_project.jobs.models import Job, JobRun


def naive_claim_next(worker_id: str) -> int | None:
    """Take the oldest pending job: read it, then mark it running. Racy on purpose."""
    job = Job.objects.filter(state=Job.State.PENDING).order_by("pk").first()
    if job is None:
        return None
    job.state = Job.State.RUNNING
    job.claimed_by = worker_id
    job.save(update_fields=["state", "claimed_by"])
    return job.pk


def naive_complete(job_id: int, worker_id: str) -> None:
    """Mark the job done and log the run, whoever owns it now."""
    Job.objects.filter(pk=job_id).update(state=Job.State.DONE, finished_at=Now())
    JobRun.objects.create(job_id=job_id, worker=worker_id, token=0)
