"""What a soak worker calls: an order is the sample's ``reserve_stock`` plus an audit row, in one transaction."""

from __future__ import annotations

import lockkit
from lockkit_harness.soak.models import Order
from sample_project.inventory.services import reserve_stock


@lockkit.locked_operation
def place_order(ref: str, sku: str, quantity: int) -> int:
    """Reserve ``quantity`` of ``sku`` and record order ``ref`` with it; return the units left.

    ``reserve_stock`` runs nested (one attempt, in this transaction); this operation owns the transaction, so
    lockkit retries the whole of it.
    """
    left = reserve_stock(sku, quantity)
    Order.objects.create(ref=ref, sku=sku, quantity=quantity)
    return left
