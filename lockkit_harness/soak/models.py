"""One row per order the soak placed, written in the reservation's transaction: the soak's audit trail."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """An order as a soak worker placed it; ``ref`` is the worker's own name for the attempt it logged."""

    ref = models.CharField(max_length=64, unique=True)
    sku = models.CharField(max_length=64)
    quantity = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.ref}: {self.quantity} x {self.sku}"
