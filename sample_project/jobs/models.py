"""Jobs with a claim (worker, token, lease), and the log of completed runs that the demo audits.

The claim columns have the names and types of ``lockkit.claims.Claimable``'s, so the model can move to that mixin
without a schema change.
"""

from __future__ import annotations

from django.db import models


class Job(models.Model):
    """A unit of work. ``claim_token`` grows by one on every claim; a write from an older claim cannot match.

    A job is claimed exactly when ``lease_expires_at`` is set.
    """

    class State(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    name = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    claimed_by = models.CharField(max_length=255, blank=True, default="")
    claim_token = models.BigIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
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
