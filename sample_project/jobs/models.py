"""Jobs claimed through ``lockkit.claims`` (the ``Claimable`` mixin), and the log of completed runs the demo
audits."""

from __future__ import annotations

from django.db import models

from lockkit.claims import Claimable


class Job(Claimable):
    """A unit of work with its own state; ``Claimable`` adds who claimed it, the fencing token and the lease.

    A job is claimed exactly when ``lease_expires_at`` is set; ``claim_token`` grows by one on every claim.
    """

    class State(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    name = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["state", "id"], name="jobs_job_state_id")]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.state})"


class JobRun(models.Model):
    """One completed run of a job, written in the same transaction as the fenced completion."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="runs")
    worker = models.CharField(max_length=100)
    token = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"run of job {self.job_id} by {self.worker} (token {self.token})"
