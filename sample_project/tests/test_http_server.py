"""The flash sale through a real WSGI server: gunicorn with several worker processes, concurrent clients."""

from __future__ import annotations

import pytest
from django.db import connections

from sample_project.demo.bootstrap import url_of
from sample_project.demo.http_sale import gunicorn, run_http_sale
from sample_project.demo.orders import ORDERS_FILE, load_orders, starting_stock
from sample_project.inventory.models import Stock

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.contention]

ORDERS = 300


def test_gunicorn_workers_never_oversell_by_hand_or_with_lockkit() -> None:
    orders = load_orders(ORDERS_FILE, ORDERS)
    stock = starting_stock(orders, 0.5)
    results = []
    with gunicorn(url_of(connections["default"].settings_dict), workers=3) as address:
        for implementation in ("hand", "lockkit", "guarded"):
            results.append(run_http_sale(address, implementation, orders, stock, clients=6, timeout=120))
    for result in results:
        totals, audit = result.totals, result.audit
        assert totals.operations == ORDERS
        assert totals.errors == 0, totals.first_error
        assert totals.successes + totals.refusals + totals.lock_timeouts == ORDERS
        assert totals.refusals > 0  # the sale sold out: the contention was real
        assert audit.oversold == 0
        assert audit.lost_updates == 0
        assert audit.reserved == totals.units
        assert audit.remaining == audit.initial - audit.reserved
    remaining = dict(Stock.objects.values_list("sku", "available"))
    assert sum(remaining.values()) == results[-1].audit.remaining
