"""The demo, scaled down: real worker processes on the test database, invariants asserted on the tables."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.db import connections
from rich.console import Console

from sample_project.demo.bootstrap import url_of
from sample_project.demo.orders import ORDERS_FILE, load_orders, starting_stock
from sample_project.demo.report import queue_table, sale_table
from sample_project.demo.runner import DemoOptions, broken_invariants, run_demo
from sample_project.inventory.models import Stock

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.contention]

ORDERS = 600
NAIVE_ORDERS = 200  # the naive sale places the first ones only, against their own starting stock
JOBS = 40


def test_bundled_orders_file_is_a_flash_sale() -> None:
    orders = load_orders(ORDERS_FILE)
    assert len(orders) >= 10_000
    hot = sum(1 for sku, _ in orders if sku.startswith("flash-"))
    assert 0.3 < hot / len(orders) < 0.5  # three SKUs take a large share of the orders
    assert all(quantity >= 1 for _, quantity in orders)


@pytest.mark.parametrize(
    "bad", ["sku,qty\na,1\n", "sku,quantity\na,0\n", "sku,quantity\na,x\n", "sku,quantity\n"]
)
def test_a_malformed_orders_file_is_refused(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "orders.csv"
    path.write_text(bad)
    with pytest.raises(ValueError, match=r"orders\.csv"):
        load_orders(path)


def test_scaled_down_demo_keeps_lockkit_invariants() -> None:
    url = url_of(connections["default"].settings_dict)
    options = DemoOptions(
        url=url,
        workers=3,
        limit=ORDERS,
        jobs=JOBS,
        naive_orders=NAIVE_ORDERS,
        queue_implementations=("naive", "lockkit"),
        lease=1.0,
    )
    console = Console(file=io.StringIO(), width=120)
    result = run_demo(options, console)

    assert broken_invariants(result) == []
    assert [sale.implementation for sale in result.sales] == ["naive", "hand", "lockkit", "guarded"]
    for sale in result.sales:
        placed = NAIVE_ORDERS if sale.implementation == "naive" else ORDERS
        stock = starting_stock(load_orders(ORDERS_FILE, placed), options.stock_ratio)
        totals = sale.totals
        assert totals.operations == placed
        assert totals.successes + totals.refusals + totals.lock_timeouts + totals.errors == placed
        assert sale.audit.initial == sum(stock.values())
        assert sale.audit.reserved == totals.units == sum(totals.confirmed.values())
        if sale.implementation != "naive":
            assert totals.errors == 0
            assert sale.audit.oversold == 0
            assert sale.audit.lost_updates == 0
            assert sale.audit.reserved == totals.units
            assert sale.audit.remaining == sale.audit.initial - sale.audit.reserved
    # The last run (guarded_update) left its stock in the table: per SKU, remaining = initial - reserved.
    remaining = dict(Stock.objects.values_list("sku", "available"))
    assert sum(remaining.values()) == result.sales[-1].audit.initial - result.sales[-1].audit.reserved

    assert [q.implementation for q in result.queues] == ["naive", "lockkit"]
    queue = result.queues[-1]
    assert queue.killed
    assert queue.totals.reclaimed >= 1
    # The stalled worker's lease ran out mid-job; its job was redone by another worker; its late, fenced
    # completion was refused: that job's effect (its JobRun row) exists once.
    assert queue.totals.stale >= 1
    assert (queue.audit.jobs, queue.audit.done, queue.audit.run_twice, queue.audit.lost) == (JOBS, JOBS, 0, 0)

    console.print(sale_table(result.sales, orders=result.orders, workers=3, skus=result.skus))
    console.print(queue_table(result.queues))
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert "units oversold" in output
    assert "jobs lost" in output
    assert "effects applied twice" in output
    assert "n/a" not in output
    # Each column names the code it ran.
    assert "sample_project/inventory/naive.py:18 reserve_stock_naive" in output
    assert "sample_project/inventory/handwritten.py:19 reserve_stock_by_hand" in output
    assert "sample_project/inventory/services.py:18 reserve_stock" in output
    assert "sample_project/inventory/guarded.py:21 reserve_stock_guarded" in output
    assert "the naive sale placed only the first 200 orders" in output
    assert "sample_project/jobs/naive.py:14 naive_claim_next" in output
    assert "sample_project/jobs/services.py:66 claim_next_job" in output
    # Round trips were counted for every implementation of the sale (uncontended, after it).
    assert set(result.round_trips) == {"naive", "hand", "lockkit", "guarded"}
    assert all(trips is not None for trips in result.round_trips.values())
