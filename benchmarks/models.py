"""The benchmark's tables, all prefixed ``lkbench_`` and created by ``benchmarks.schema`` (no migrations)."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from lockkit.claims import Claimable


class Item(models.Model):
    """A stock row: reservations move units from ``available`` to ``reserved``."""

    id = models.IntegerField(primary_key=True)
    available = models.BigIntegerField()
    reserved = models.BigIntegerField(default=0)

    # Declared, so that type checkers configured with the test suite's settings know the manager too.
    objects: ClassVar[models.Manager[Item]] = models.Manager()

    class Meta:
        db_table = "lkbench_item"

    def __str__(self) -> str:
        return f"item {self.id}: {self.available} available"


class Job(Claimable):
    """A job of a queue: lockkit's claim fields (``Claimable``) plus the queue's own state."""

    state = models.CharField(max_length=10, default="pending")

    objects: ClassVar[models.Manager[Job]] = models.Manager()

    class Meta:
        db_table = "lkbench_job"
        # What a real queue table has: the claim query finds pending jobs without walking finished ones.
        indexes = (
            models.Index(fields=["id"], name="lkbench_job_pending", condition=models.Q(state="pending")),
        )

    def __str__(self) -> str:
        return f"job {self.pk}: {self.state}"
