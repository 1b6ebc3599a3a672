"""DO NOT COPY: the read-then-write reservation the demo compares lockkit against.

It reads the count, decides in Python, and writes the computed value back, in two autocommit statements. Two
requests that read the same count both succeed and the second write overwrites the first (a lost update): units
are promised that were never taken from stock. The check constraint cannot catch it, because every value written
is non-negative.
"""

from __future__ import annotations

from django.db import router

from sample_project.inventory.errors import InsufficientStock
from sample_project.inventory.models import Stock
from sample_project.inventory.validation import check_quantity, check_sku


def reserve_stock_naive(sku: str, quantity: int) -> int:
    """Reserve like much real code does: ``get()``, compare, ``save()``. Racy on purpose."""
    check_sku(sku)
    check_quantity(quantity)
    alias = router.db_for_write(Stock)
    stock = Stock.objects.using(alias).get(pk=sku)
    if stock.available < quantity:
        raise InsufficientStock(sku, quantity, stock.available)
    stock.available -= quantity
    stock.save(update_fields=["available"], using=alias)
    return stock.available
