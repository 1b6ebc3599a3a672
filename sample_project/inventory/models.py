"""Stock per SKU, and one reservation row per line of an order (``reserve_order``), so its units can be audited."""

from __future__ import annotations

from django.db import models


class Stock(models.Model):
    """Units of one SKU still available; the database refuses a negative count."""

    sku = models.CharField(max_length=64, primary_key=True)
    available = models.IntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(available__gte=0), name="inventory_stock_available_gte_0"
            )
        ]

    def __str__(self) -> str:
        return f"{self.sku}: {self.available}"


class Reservation(models.Model):
    """``quantity`` units of ``stock`` promised to a customer, written in the decrement's transaction (an order's line)."""

    stock = models.ForeignKey(Stock, on_delete=models.CASCADE, related_name="reservations")
    quantity = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(quantity__gt=0), name="inventory_reservation_qty_gt_0")
        ]

    def __str__(self) -> str:
        return f"{self.quantity} x {self.stock_id}"
