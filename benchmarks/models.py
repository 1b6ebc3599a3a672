"""The benchmark's tables, all prefixed ``lkbench_`` and created by ``benchmarks.schema`` (no migrations)."""

from __future__ import annotations

import importlib
from typing import ClassVar

from django.db import models


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


def _job_model() -> type[models.Model] | None:
    """``Job(Claimable)`` when ``lockkit.claims`` exists in this checkout, else ``None`` (workload 5 is skipped).

    Built with ``type()`` because the base class exists only on branches where the claims module has landed.
    """
    try:
        claims = importlib.import_module("lockkit.claims")
    except ImportError:
        return None
    meta = type(
        "Meta",
        (),
        {
            "db_table": "lkbench_job",
            "app_label": "benchmarks",
            # What a real queue table has: the claim query finds pending jobs without walking finished ones.
            "indexes": [
                models.Index(fields=["id"], name="lkbench_job_pending", condition=models.Q(state="pending"))
            ],
        },
    )
    attrs = {
        "__module__": __name__,
        "state": models.CharField(max_length=10, default="pending"),
        "Meta": meta,
    }
    job: type[models.Model] = type("Job", (claims.Claimable,), attrs)
    return job


Job = _job_model()
