"""The cheapest correct form for one counter: ``lockkit.guarded_update``, a conditional ``UPDATE`` in one message.

``UPDATE inventory_stock SET available = available - %s WHERE sku = %s AND available >= %s RETURNING ...`` is
atomic on its own: PostgreSQL locks the row for the update, re-checks the ``WHERE`` against the latest committed
version, and updates only when enough stock is left. On PostgreSQL outside a transaction lockkit sends it with its
``BEGIN``, lock timeout and ``COMMIT`` as one message: one round trip, the row locked for that round trip only.
It fits when the database can evaluate the whole decision; once the decision needs Python (a rule per customer,
several rows), lock the row and decide (``sample_project.inventory.services``).
"""

from __future__ import annotations

from django.db.models import F

from lockkit import guarded_update
from sample_project.inventory.errors import InsufficientStock
from sample_project.inventory.models import Stock
from sample_project.inventory.validation import check_quantity, check_sku


def reserve_stock_guarded(sku: str, quantity: int) -> int:
    """Reserve ``quantity`` units of ``sku`` with one guarded ``UPDATE`` (``reserve_stock``'s contract).

    Returns:
        The units still available after this reservation.

    Raises:
        TypeError, ValueError: bad arguments, before any SQL.
        Stock.DoesNotExist: no such SKU.
        InsufficientStock: fewer than ``quantity`` units are available; nothing was changed.
        lockkit.LockTimeout: the row stayed locked, after the retries.
    """
    check_sku(sku)
    check_quantity(quantity)
    rows = guarded_update(
        Stock.objects.filter(pk=sku, available__gte=quantity), available=F("available") - quantity
    )
    if rows:
        return int(rows[0].available)
    # Nothing updated: find out why. Not a race: the answer is only reported, never acted on.
    available = Stock.objects.filter(pk=sku).values_list("available", flat=True).first()
    if available is None:
        raise Stock.DoesNotExist(f"no Stock for sku {sku!r}")
    raise InsufficientStock(sku, quantity, available)
