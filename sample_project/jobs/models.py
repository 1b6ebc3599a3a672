"""Jobs with a claim (owner, token, lease), and the log of completed runs that the demo audits."""

from __future__ import annotations

from django.db import models


class Job(models.Model):
    """A unit of work. ``token`` grows by one on every claim; a write from an older claim cannot match."""

    class State(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    name = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    owner = models.CharField(max_length=100, blank=True, default="")
    token = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
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
