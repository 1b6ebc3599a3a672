"""Domain errors of the inventory."""

from __future__ import annotations


class InsufficientStock(Exception):
    """A reservation asked for more units than a SKU has; nothing was changed.

    Attributes:
        sku: The SKU that is short.
        requested: Units asked for.
        available: Units there were.
    """

    def __init__(self, sku: str, requested: int, available: int) -> None:
        super().__init__(f"{sku}: {requested} requested, {available} available")
        self.sku = sku
        self.requested = requested
        self.available = available
