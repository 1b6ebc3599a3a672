"""Under ATOMIC_REQUESTS a locked operation is nested in the request's transaction: one attempt, fail fast."""

from __future__ import annotations

import pytest
from django.db import connections
from django.test import Client

from lockkit.testing import hold_lock
from lockkit_tests import urls
from lockkit_tests.models import Stock

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("lockkit_tests.urls")]


def test_atomic_requests_nested_operation_fails_fast_without_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    monkeypatch.setattr(urls, "ATTEMPTS", [])
    stock = Stock.objects.create(sku="hot", available=4)
    client = Client()
    with hold_lock(stock):
        response = client.get("/reserve/hot/")
    assert response.status_code == 409
    assert response.json() == {"error": "lock_timeout", "attempts": 1}
    assert urls.ATTEMPTS == [1]  # no retry inside the request's transaction
    # The view caught the error and returned normally, so the request's transaction committed its own write.
    assert Stock.objects.filter(sku="audit-0").exists()
    response = client.get("/reserve/hot/")
    assert response.status_code == 200
    assert response.json() == {"available": 4}
