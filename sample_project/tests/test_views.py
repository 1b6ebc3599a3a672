"""The JSON endpoints, including the ATOMIC_REQUESTS view that fails fast instead of retrying."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections
from django.test import Client, override_settings

from lockkit import RetryEvent, RetryPolicy
from lockkit.testing import hold_lock, run_concurrently
from sample_project.inventory.models import Stock
from sample_project.jobs.models import Job
from sample_project.jobs.services import enqueue

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("sample_project.urls")]


@pytest.fixture(autouse=True)
def atomic_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the sample settings: requests are atomic unless the view opts out (``non_atomic_requests``)."""
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)


def post(path: str, body: Any, client: Client | None = None) -> tuple[int, Any]:
    response = (client or Client()).post(path, json.dumps(body), content_type="application/json")
    return response.status_code, (json.loads(response.content) if response.content else None)


def test_reserve_endpoint(make_stock: Callable[..., None]) -> None:
    make_stock(book_1=2)
    assert post("/inventory/reserve", {"sku": "book-1", "quantity": 1}) == (
        200,
        {"sku": "book-1", "remaining": 1},
    )
    status, body = post("/inventory/reserve", {"sku": "book-1", "quantity": 5})
    assert (status, body["error"], body["available"]) == (409, "insufficient_stock", 1)
    assert post("/inventory/reserve", {"sku": "nope", "quantity": 1})[0] == 404
    assert post("/inventory/reserve", {"sku": "book-1", "quantity": True})[0] == 400
    assert post("/inventory/reserve", {"sku": "book-1", "quantity": 1, "impl": "magic"})[0] == 400
    assert post("/inventory/reserve", [1, 2])[0] == 400
    assert Client().get("/inventory/reserve").status_code == 405
    assert json.loads(Client().get("/inventory/stock/book-1").content) == {"sku": "book-1", "available": 1}


def test_order_endpoint_is_all_or_nothing(make_stock: Callable[..., None]) -> None:
    make_stock(a=3, b=1)
    status, body = post("/inventory/orders", {"lines": [["a", 1], ["b", 2]]})
    assert (status, body["sku"]) == (409, "b")
    assert post("/inventory/orders", {"lines": [["b", 1], ["a", 2]]}) == (
        200,
        {"remaining": {"a": 1, "b": 0}},
    )


@pytest.mark.contention
@pytest.mark.parametrize("impl", ["lockkit", "guarded", "hand"])
def test_concurrent_requests_never_oversell(impl: str, make_stock: Callable[..., None]) -> None:
    make_stock(hot=4)
    outcomes = run_concurrently(
        lambda: post("/inventory/reserve", {"sku": "hot", "quantity": 1, "impl": impl}), 8, timeout=30
    )
    statuses = sorted(o.result[0] for o in outcomes if o.result is not None)
    assert statuses == [200] * 4 + [409] * 4
    assert Stock.objects.get(pk="hot").available == 0


@pytest.mark.contention
def test_atomic_request_fails_fast_with_409_when_asked_not_to_wait(make_stock: Callable[..., None]) -> None:
    make_stock(book_1=2)
    with hold_lock(Stock.objects.filter(pk="book-1")):
        status, body = post("/inventory/reserve-in-request", {"sku": "book-1", "quantity": 1, "nowait": True})
    assert status == 409
    assert body["error"] == "lock_not_available"
    assert body["attempts"] == 1
    assert body["retried_inside_request"] is False
    assert body["available"] == 2  # read after the failure, in the same request transaction: still usable
    assert Stock.objects.get(pk="book-1").available == 2


@pytest.mark.contention
def test_atomic_request_answers_503_after_one_lock_timeout_without_retrying(
    make_stock: Callable[..., None],
) -> None:
    make_stock(book_1=2)
    with override_settings(LOCKKIT={"LOCK_TIMEOUT": 0.2}), hold_lock(Stock.objects.filter(pk="book-1")):
        response = Client().post(
            "/inventory/reserve-in-request", {"sku": "book-1", "quantity": 1}, content_type="application/json"
        )
    body = json.loads(response.content)
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert (body["error"], body["attempts"], body["sqlstate"]) == ("lock_timeout", 1, "55P03")
    assert Stock.objects.get(pk="book-1").available == 2
    # Without a held lock the same view succeeds inside the request transaction.
    assert post("/inventory/reserve-in-request", {"sku": "book-1", "quantity": 2}) == (
        200,
        {"sku": "book-1", "remaining": 0},
    )


@pytest.mark.contention
def test_the_non_atomic_reserve_view_owns_its_transaction_and_retries(
    make_stock: Callable[..., None],
) -> None:
    """The same lock timeout: the non-atomic view is retried by lockkit (3 attempts), not the atomic one."""
    make_stock(book_1=2)
    events: list[RetryEvent] = []
    policy = RetryPolicy(attempts=3, before_retry=events.append)
    with (
        override_settings(LOCKKIT={"LOCK_TIMEOUT": 0.1, "RETRY": policy}),
        hold_lock(Stock.objects.filter(pk="book-1")),
    ):
        status, body = post("/inventory/reserve", {"sku": "book-1", "quantity": 1})
    assert (status, body["error"], body["attempts"]) == (503, "lock_timeout", 3)
    assert [e.attempt for e in events] == [1, 2]
    assert Stock.objects.get(pk="book-1").available == 2


@pytest.mark.contention
def test_job_endpoints_claim_once_and_fence_completion() -> None:
    job = enqueue("email")
    outcomes = run_concurrently(
        lambda i: post(f"/jobs/{job.pk}/claim", {"worker": f"w{i}"}),
        6,
        args=[(i,) for i in range(6)],
        timeout=30,
    )
    statuses = sorted(o.result[0] for o in outcomes if o.result is not None)
    assert statuses == [200] + [409] * 5
    owner = Job.objects.get(pk=job.pk).claimed_by
    assert post(f"/jobs/{job.pk}/complete", {"worker": "someone-else", "token": 1}) == (
        409,
        {"completed": False, "error": "stale_claim"},
    )
    assert post(f"/jobs/{job.pk}/complete", {"worker": owner, "token": 2}) == (
        409,
        {"completed": False, "error": "stale_claim"},
    )
    assert post(f"/jobs/{job.pk}/complete", {"worker": owner, "token": 1}) == (200, {"completed": True})
    assert (
        post(f"/jobs/{job.pk}/complete", {"worker": owner, "token": 1})[0] == 409
    )  # done: no longer claimed
    assert json.loads(Client().get(f"/jobs/{job.pk}").content)["state"] == "done"


def test_job_queue_endpoints() -> None:
    status, body = post("/jobs/", {"name": "email"})
    assert status == 201
    status, claim = post("/jobs/claim-next", {"worker": "w1"})
    assert (status, claim) == (200, {"id": body["id"], "token": 1})
    assert post("/jobs/claim-next", {"worker": "w1"}) == (204, None)
    assert post("/jobs/claim-next", {"worker": 7})[0] == 400
    assert post(f"/jobs/{body['id']}/complete", {"worker": "w1", "token": "1"})[0] == 400
    assert Client().get("/jobs/999999").status_code == 404
    assert post("/jobs/", {"name": ""})[0] == 400
    assert post("/jobs/", {"name": "email", "payload": [1]})[0] == 400
    assert Job.objects.count() == 1
