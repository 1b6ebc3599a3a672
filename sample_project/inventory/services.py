"""Reserving stock with lockkit: lock the row that decides, decide in Python, write, commit; retried as a whole.

``reserve_stock`` is ``lockkit.locked_update``: on PostgreSQL two round trips (the locking ``SELECT``, then
``UPDATE ...; COMMIT``), the correct form with the fewest round trips when Python decides. ``reserve_order`` locks several rows in
primary-key order in a locked operation and records a ``Reservation`` row per line in the same transaction, so
concurrent orders with overlapping SKUs queue behind each other instead of deadlocking. docs/usage.md ("Which form
for which job") and docs/sample_project.md compare them with hand-written code and ``guarded_update``.
"""

from __future__ import annotations

from lockkit import LockScope, current_scope, locked_operation, locked_update
from sample_project.inventory.errors import InsufficientStock
from sample_project.inventory.models import Reservation, Stock
from sample_project.inventory.validation import check_flag, check_lines, check_quantity, check_sku


def reserve_stock(sku: str, quantity: int, *, nowait: bool = False) -> int:
    """Reserve ``quantity`` units of ``sku`` and return the units left.

    One ``lockkit.locked_update``: the row is locked, checked in Python and written, and the transaction commits;
    retried as a whole on deadlock, serialization failure and lock timeout when it owns the transaction. Inside an
    outer ``atomic()`` (``ATOMIC_REQUESTS``) it makes one attempt in a savepoint and raises.

    Args:
        sku: The SKU (the ``Stock`` primary key).
        quantity: Units to reserve, a positive ``int``.
        nowait: Fail at once with ``LockNotAvailable`` when another transaction holds the row, instead
            of waiting up to the lock timeout. Not retried.

    Returns:
        The units still available after this reservation.

    Raises:
        TypeError, ValueError: ``sku`` is not a non-empty ``str``, or ``quantity`` is not a positive ``int``
            (``bool`` included); raised before any SQL.
        Stock.DoesNotExist: no such SKU.
        InsufficientStock: fewer than ``quantity`` units are available; nothing was changed.
        lockkit.LockNotAvailable: ``nowait`` and the row is locked by another transaction.
        lockkit.LockTimeout, lockkit.DeadlockDetected: still failing after the retries.
    """
    check_sku(sku)
    check_quantity(quantity)

    def change(stock: Stock) -> dict[str, int]:
        # Runs while the row is locked: decide from the row only (no query: lockkit refuses one).
        if stock.available < quantity:
            raise InsufficientStock(sku, quantity, stock.available)
        return {"available": stock.available - quantity}

    written = locked_update(Stock.objects.filter(pk=sku), change, nowait=check_flag(nowait, "nowait"))
    return written.available


def reserve_order(lines: object) -> dict[str, int]:
    """Reserve every line of an order in one transaction, with a ``Reservation`` row per line: all lines or none.

    Rows are locked in primary-key order (``LockScope.lock_all``), so two orders sharing SKUs, in any order,
    wait for each other instead of deadlocking.

    Args:
        lines: ``{sku: quantity}`` or an iterable of ``(sku, quantity)`` pairs; a repeated SKU is added up.

    Returns:
        ``{sku: units left}`` for every SKU of the order.

    Raises:
        TypeError, ValueError: malformed lines (see ``reserve_stock``), before any SQL.
        Stock.DoesNotExist: a SKU does not exist; nothing was changed.
        InsufficientStock: a line asks for more than is available; nothing was changed.
        lockkit.LockTimeout, lockkit.DeadlockDetected: still failing after the retries.
    """
    return _reserve_order(check_lines(lines))


@locked_operation(model=Stock)
def _reserve_order(lines: dict[str, int]) -> dict[str, int]:
    scope = current_scope()
    # Locked in primary-key order whatever the order asked; a missing SKU raises Stock.DoesNotExist.
    rows = scope.lock_all(Stock, pks=list(lines))
    return _take(scope, rows, lines)


def _take(scope: LockScope, rows: list[Stock], lines: dict[str, int]) -> dict[str, int]:
    """Check every locked row, record the reservations, then decrement the rows (all checks first)."""
    for row in rows:
        if row.available < lines[row.sku]:
            raise InsufficientStock(row.sku, lines[row.sku], row.available)
    Reservation.objects.using(scope.alias).bulk_create(
        [Reservation(stock_id=row.sku, quantity=lines[row.sku]) for row in rows]
    )
    for row in rows:
        row.available -= lines[row.sku]
        row.save(update_fields=["available"], using=scope.alias)
    return {row.sku: row.available for row in rows}
