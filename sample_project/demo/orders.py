"""Reading an orders file (CSV ``sku,quantity`` with a header) and deriving the sale's starting stock."""

from __future__ import annotations

import csv
import math
from collections import Counter
from pathlib import Path

from sample_project.inventory.validation import check_quantity, check_sku

Order = tuple[str, int]

ORDERS_FILE = Path(__file__).with_name("orders.csv")
#: Orders the naive sale places by default (the first ones, against their own starting stock): enough to
#: oversell, briefly. ``demo --naive`` gives it every order.
NAIVE_ORDERS = 2_000


def load_orders(path: Path, limit: int | None = None) -> list[Order]:
    """Read ``path``; return its orders (the first ``limit`` when given).

    Raises:
        ValueError: a row is not ``sku,quantity`` with a positive integer quantity (the message names it).
    """
    orders: list[Order] = []
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or [h.strip().lower() for h in header] != ["sku", "quantity"]:
            raise ValueError(f"{path}: the first line must be the header 'sku,quantity'")
        for line, row in enumerate(reader, start=2):
            if limit is not None and len(orders) >= limit:
                break
            try:
                sku, quantity = row
                orders.append((check_sku(sku.strip()), check_quantity(int(quantity))))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{line}: expected sku,quantity; {exc}") from exc
    if not orders:
        raise ValueError(f"{path}: no orders")
    return orders


def starting_stock(orders: list[Order], ratio: float) -> dict[str, int]:
    """Stock per SKU: ``ratio`` of the units ordered (at least 1), so a sale with ``ratio < 1`` sells out."""
    if not ratio > 0:
        raise ValueError(f"stock ratio must be positive, got {ratio}")
    demand: Counter[str] = Counter()
    for sku, quantity in orders:
        demand[sku] += quantity
    return {sku: max(1, math.floor(units * ratio)) for sku, units in sorted(demand.items())}


def sale_of(
    implementation: str, orders: list[Order], ratio: float, naive_orders: int | None
) -> tuple[list[Order], dict[str, int]]:
    """The orders a sale places and its starting stock: every order, except the naive sale's first
    ``naive_orders`` (``None``: every order), against their own starting stock."""
    if implementation == "naive" and naive_orders is not None:
        orders = orders[:naive_orders]
    return orders, starting_stock(orders, ratio)
