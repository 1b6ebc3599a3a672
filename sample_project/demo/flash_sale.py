"""The flash sale: W processes place the same orders against the same starting stock, per implementation.

After each run the stock table is audited against what the buyers were told, per SKU: units reserved (the
successful reservations' units, counted by the workers), units oversold (reserved beyond the starting stock) and
units lost to overwrites (reserved but never taken off the stock count).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sample_project.demo.processes import run_workers
from sample_project.demo.stats import Totals
from sample_project.demo.workers import sale_worker
from sample_project.inventory.models import Reservation, Stock

IMPLEMENTATIONS = ("naive", "hand", "lockkit", "guarded")
LABELS = {
    "naive": "naive read-then-write",
    "hand": "hand-written select_for_update",
    "lockkit": "lockkit locked_update",
    "guarded": "lockkit guarded_update",
}


@dataclass(frozen=True)
class SaleAudit:
    """The stock table after a run, against the starting stock and the units the buyers were told they got."""

    initial: int
    remaining: int
    reserved: int
    oversold: int
    lost_updates: int

    @property
    def consistent(self) -> bool:
        """Remaining stock equals the starting stock minus the units reserved, for every SKU."""
        return self.lost_updates == 0 and self.remaining == self.initial - self.reserved


@dataclass(frozen=True)
class SaleResult:
    implementation: str
    totals: Totals
    audit: SaleAudit


def reset_stock(stock: dict[str, int]) -> None:
    Reservation.objects.all().delete()
    Stock.objects.all().delete()
    Stock.objects.bulk_create([Stock(sku=sku, available=units) for sku, units in stock.items()])


def audit_stock(stock: dict[str, int], confirmed: dict[str, int]) -> SaleAudit:
    """Compare the ``Stock`` table with ``stock`` (the starting units) and ``confirmed`` (units reserved per SKU)."""
    remaining = dict(Stock.objects.values_list("sku", "available"))
    reserved = {sku: units for sku, units in confirmed.items() if units}
    oversold = lost = 0
    for sku, initial in stock.items():
        taken = reserved.get(sku, 0)
        oversold += max(0, taken - initial)
        lost += abs(taken - (initial - remaining[sku]))
    return SaleAudit(
        initial=sum(stock.values()),
        remaining=sum(remaining.values()),
        reserved=sum(reserved.values()),
        oversold=oversold,
        lost_updates=lost,
    )


def run_sale(
    url: str,
    implementation: str,
    orders: list[tuple[str, int]],
    stock: dict[str, int],
    *,
    workers: int,
    progress: Callable[[int], None],
    lock_timeout: float = 2.0,
    timeout: float = 600.0,
) -> SaleResult:
    """Reset the stock, place ``orders`` from ``workers`` processes with ``implementation``, audit."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, not {implementation!r}")
    reset_stock(stock)
    shares = [(url, implementation, orders[i::workers], lock_timeout) for i in range(workers)]
    stats, _ = run_workers(sale_worker, shares, progress=progress, timeout=timeout)
    totals = Totals.of(stats)
    return SaleResult(implementation, totals, audit_stock(stock, totals.confirmed))
