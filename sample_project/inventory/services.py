"""Reserving stock with lockkit: lock the rows that decide, check, write, commit; retried as a whole.

``reserve_stock`` locks one ``Stock`` row; ``reserve_order`` locks several in primary-key order, so concurrent
orders with overlapping SKUs queue behind each other instead of deadlocking. The last ``UPDATE`` goes to the
database with the ``COMMIT`` (``scope.save_with_commit``), the fastest correct form. For the one-counter case a
guarded decrement (``sample_project.inventory.guarded``) is cheaper; docs/sample_project.md compares them.
"""

from __future__ import annotations

from lockkit import LockScope, current_scope, locked_operation
from sample_project.inventory.errors import InsufficientStock
from sample_project.inventory.models import Reservation, Stock
from sample_project.inventory.validation import check_flag, check_lines, check_quantity, check_sku


def reserve_stock(sku: str, quantity: int, *, nowait: bool = False) -> int:
    """Reserve ``quantity`` units of ``sku`` and return the units left.

    Runs in its own locked transaction, retried on deadlock, serialization failure and lock timeout when it
    owns the transaction; inside an outer ``atomic()`` (``ATOMIC_REQUESTS``) it makes one attempt and raises.

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
    return _RESERVE[check_flag(nowait, "nowait")](check_sku(sku), check_quantity(quantity))


def reserve_order(lines: object) -> dict[str, int]:
    """Reserve every line of an order in one transaction: all lines or none.

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


def _reserve(sku: str, quantity: int) -> int:
    scope = current_scope()
    return _take(scope, [scope.get(Stock, pk=sku)], {sku: quantity})[sku]


# One body, one locked operation per lock mode: a scope's ``nowait`` is fixed when the operation is declared
# (lockkit reads it to tell a NOWAIT refusal from a lock timeout, which share SQLSTATE 55P03), so ``reserve_stock``
# picks the operation by its ``nowait`` argument.
_RESERVE = {nowait: locked_operation(model=Stock, nowait=nowait)(_reserve) for nowait in (False, True)}


@locked_operation(model=Stock)
def _reserve_order(lines: dict[str, int]) -> dict[str, int]:
    scope = current_scope()
    # Locked in primary-key order whatever the order asked; a missing SKU raises Stock.DoesNotExist.
    rows = scope.lock_all(Stock, pks=list(lines))
    return _take(scope, rows, lines)


def _take(scope: LockScope, rows: list[Stock], lines: dict[str, int]) -> dict[str, int]:
    """Check every locked row, record the reservations, then decrement the rows (all checks first).

    The last row's ``UPDATE`` travels with the ``COMMIT`` (``scope.save_with_commit``, the scope's last statement),
    so the row lock is held one round trip less; a plain ``save()`` where the backend cannot send them together.
    """
    for row in rows:
        if row.available < lines[row.sku]:
            raise InsufficientStock(row.sku, lines[row.sku], row.available)
    Reservation.objects.using(scope.alias).bulk_create(
        [Reservation(stock_id=row.sku, quantity=lines[row.sku]) for row in rows]
    )
    *others, last = rows
    for row in rows:
        row.available -= lines[row.sku]
    for row in others:
        row.save(update_fields=["available"], using=scope.alias)
    scope.save_with_commit(last, update_fields=["available"])
    return {row.sku: row.available for row in rows}
