"""The async endpoint through Django's AsyncClient, under contention; ``/metrics`` after the requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import ThreadSensitiveContext
from django.db import connections
from django.test import AsyncClient, Client

from lockkit.contrib import prometheus
from lockkit.testing import hold_lock, in_thread, wait_until_blocked
from sample_project.inventory.models import Stock

pytestmark = [pytest.mark.contention, pytest.mark.urls("sample_project.urls")]
JOIN = 30.0


@pytest.fixture(autouse=True)
def atomic_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the sample settings: requests are atomic unless the view opts out, which an async view must."""
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)


@pytest.fixture
def metrics() -> Iterator[prometheus.Metrics]:
    installed = prometheus.install()  # the default registry, which /metrics serves
    try:
        yield installed
    finally:
        installed.uninstall()


async def post(client: AsyncClient, body: Any) -> tuple[int, Any]:
    # Django's ASGI handler runs each request in its own thread-sensitive context (one thread per request for
    # its sync work); AsyncClient does not, so the test opens one per request as the server would.
    async with ThreadSensitiveContext():
        response = await client.post(
            "/inventory/reserve-async", json.dumps(body), content_type="application/json"
        )
    return response.status_code, json.loads(response.content)


def test_two_concurrent_async_requests_on_one_row_wait_and_both_succeed(
    make_stock: Callable[..., None], metrics: prometheus.Metrics
) -> None:
    make_stock(book_1=2)
    client = AsyncClient()
    with hold_lock(Stock.objects.get(pk="book-1")) as holder:

        async def scenario() -> list[tuple[int, Any]]:
            requests = [asyncio.create_task(post(client, {"sku": "book-1", "quantity": 1})) for _ in range(2)]
            # Both requests' sessions wait for the holder (one queued behind the other): two threads, two
            # connections, as two sync requests.
            waiting = await asyncio.wait_for(asyncio.to_thread(wait_until_blocked, holder, count=2), JOIN)
            assert len(waiting) == 2
            await asyncio.wait_for(asyncio.to_thread(holder.release), JOIN)
            return await asyncio.wait_for(asyncio.gather(*requests), JOIN)

        results = asyncio.run(scenario())
    assert sorted(results, key=lambda result: -result[1]["remaining"]) == [
        (200, {"sku": "book-1", "remaining": 1}),
        (200, {"sku": "book-1", "remaining": 0}),
    ]
    assert Stock.objects.get(pk="book-1").available == 0
    status, body = asyncio.run(post(client, {"sku": "book-1", "quantity": 1}))
    assert (status, body["error"]) == (409, "insufficient_stock")

    # An order (reserve_order, a locked operation: its metrics below) that waited for a row another session held,
    # then one refused. locked_update's two-message path sends no operation signals: the reservations above have
    # no samples.
    make_stock(pen=3)

    def order() -> tuple[int, Any]:
        response = Client().post("/inventory/orders", json.dumps({"lines": [["pen", 2]]}), "application/json")
        return response.status_code, json.loads(response.content)

    with hold_lock(Stock.objects.get(pk="pen")) as holder:
        waiting = in_thread(order)
        wait_until_blocked(holder, contenders=waiting)
        holder.release()
    assert waiting.result(timeout=JOIN) == (200, {"remaining": {"pen": 1}})
    assert order()[0] == 409

    text = asyncio.run(client.get("/metrics")).content.decode()
    operation = 'alias="default",operation="sample_project.inventory.services._reserve_order"'
    assert f'lockkit_operations_total{{{operation},outcome="ok"}} 1.0' in text
    assert f'lockkit_operations_total{{{operation},outcome="error"}} 1.0' in text
    assert 'lockkit_lock_wait_seconds_count{alias="default",model="inventory.Stock"} 2.0' in text


def test_bad_input_answers_400_before_any_sql(make_stock: Callable[..., None]) -> None:
    status, body = asyncio.run(post(AsyncClient(), {"sku": "book-1", "quantity": 0}))
    assert (status, body["error"]) == (400, "bad_request")
