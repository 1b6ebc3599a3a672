"""The cheap alternative for one counter: a guarded single-statement decrement, no explicit row lock.

``UPDATE inventory_stock SET available = available - %s WHERE sku = %s AND available >= %s`` is atomic on its
own: PostgreSQL locks the row for the update, re-checks the ``WHERE`` against the latest committed version,
and updates only when enough stock is left. One statement, one row lock held for the shortest possible time.
It fits when the decision is a single comparison on the row being written; once the decision reads several
rows or branches on the current value (several SKUs, a rule per customer), lock first
(``sample_project.inventory.services``).
"""

from __future__ import annotations

from django.db import router, transaction
from django.db.models import F

from sample_project.inventory.errors import InsufficientStock
from sample_project.inventory.models import Reservation, Stock
from sample_project.inventory.validation import check_quantity, check_sku


def reserve_stock_guarded(sku: str, quantity: int) -> int:
    """Reserve ``quantity`` units of ``sku`` with one conditional ``UPDATE`` (``reserve_stock``'s contract).

    Returns:
        The units still available after this reservation.

    Raises:
        TypeError, ValueError: bad arguments, before any SQL.
        Stock.DoesNotExist: no such SKU.
        InsufficientStock: fewer than ``quantity`` units are available; nothing was changed.
    """
    check_sku(sku)
    check_quantity(quantity)
    alias = router.db_for_write(Stock)
    with transaction.atomic(using=alias):
        stock = Stock.objects.using(alias).filter(pk=sku)
        if not stock.filter(available__gte=quantity).update(available=F("available") - quantity):
            # Nothing updated: find out why. Not a race: the answer is only reported, never acted on.
            available = stock.values_list("available", flat=True).first()
            if available is None:
                raise Stock.DoesNotExist(f"no Stock for sku {sku!r}")
            raise InsufficientStock(sku, quantity, available)
        Reservation.objects.using(alias).create(stock_id=sku, quantity=quantity)
        # Our UPDATE holds the row lock until commit, so this reads the value it wrote.
        remaining = stock.values_list("available", flat=True).get()
    return remaining
