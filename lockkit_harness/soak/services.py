"""What a soak worker calls: an order is the sample's ``reserve_stock`` plus an audit row, in one transaction."""

from __future__ import annotations

from collections.abc import Callable

import lockkit
from lockkit_harness.soak.models import Order
from sample_project.inventory.models import Reservation
from sample_project.inventory.services import reserve_stock

#: Called with an order's ref by its ``on_commit`` callback (the worker logs it: "delivered").
on_delivered: Callable[[str], None] | None = None


def _deliver(ref: str) -> None:
    if on_delivered is not None:
        on_delivered(ref)


@lockkit.locked_operation
def place_order(ref: str, sku: str, quantity: int) -> int:
    """Reserve ``quantity`` of ``sku`` and record order ``ref`` and its reservation with it; return the units left.

    ``reserve_stock`` (``locked_update``) runs nested (one attempt, in a savepoint of this transaction), so the
    reservation and the order rows commit with the decrement; this operation owns the transaction, so
    lockkit retries the whole of it. Its ``on_commit`` callback stands for the e-mail a real order sends: the soak
    checks it runs exactly once for each order the call reported done, and never for one that did not commit.
    """
    left = reserve_stock(sku, quantity)
    Reservation.objects.create(stock_id=sku, quantity=quantity)
    Order.objects.create(ref=ref, sku=sku, quantity=quantity)
    lockkit.current_scope().on_commit(lambda: _deliver(ref))
    return left
