"""The careful hand-written reservation: ``select_for_update()`` in ``atomic()``, decide in Python, ``save()``.

Correct under any concurrency, and what lockkit's ``reserve_stock`` replaces: the demo runs it next to lockkit's
forms. Four round trips on PostgreSQL (``BEGIN``, ``SELECT ... FOR UPDATE``, ``UPDATE``, ``COMMIT``), the row
locked from the ``SELECT`` to the ``COMMIT`` reply. Without lockkit the lock wait is unbounded (PostgreSQL's
``lock_timeout`` is 0 unless set: one more statement), a deadlock or lock timeout surfaces as a bare
``OperationalError`` and nothing retries.
"""

from __future__ import annotations

from django.db import router, transaction

from sample_project.inventory.errors import InsufficientStock
from sample_project.inventory.models import Stock
from sample_project.inventory.validation import check_quantity, check_sku


def reserve_stock_by_hand(sku: str, quantity: int) -> int:
    """Reserve ``quantity`` units of ``sku`` with a hand-written locked read (``reserve_stock``'s contract).

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
        stock = Stock.objects.using(alias).select_for_update().get(pk=sku)
        if stock.available < quantity:
            raise InsufficientStock(sku, quantity, stock.available)
        stock.available -= quantity
        stock.save(update_fields=["available"], using=alias)
    return stock.available
