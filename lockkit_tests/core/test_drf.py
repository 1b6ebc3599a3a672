"""Django REST framework: lockkit's transient errors as 503 with Retry-After, views opted out of ATOMIC_REQUESTS.

Real contention on PostgreSQL: the locked row is held by another session (``hold_lock``), and the view's
``locked_operation`` times out (``LockTimeout``) or fails at once (``LockNotAvailable``).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connections, transaction
from django.test import override_settings
from django.urls import path
from django.utils.decorators import method_decorator
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIClient, APIRequestFactory
from rest_framework.views import APIView

import lockkit
from lockkit.contrib import drf
from lockkit.testing import Holder, hold_lock
from lockkit_tests.models import Stock

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls(__name__)]

ATTEMPTS: list[int] = []
HOLDERS: list[Holder] = []


def _let_go(event: lockkit.RetryEvent) -> None:
    """Before the second attempt, the holder (if a test gave one) ends its transaction."""
    for holder in HOLDERS:
        holder.release()


@lockkit.locked_operation(model=Stock, lock_timeout=0.2, retry=lockkit.RetryPolicy(before_retry=_let_go))
def take(sku: str) -> int:
    ATTEMPTS.append(lockkit.current_scope().attempt)
    stock = lockkit.current_scope().get(Stock, sku=sku)
    stock.available -= 1
    stock.save(update_fields=["available"])
    return stock.available


@lockkit.locked_operation(model=Stock, nowait=True)
def take_now(sku: str) -> int:
    ATTEMPTS.append(lockkit.current_scope().attempt)
    return lockkit.current_scope().get(Stock, sku=sku).available


class TakeView(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def post(self, request: Request, sku: str) -> Response:
        Stock.objects.create(sku=f"audit-{len(ATTEMPTS)}", available=0)  # the request's own write
        if sku == "missing":
            raise NotFound("no such stock")
        available = take_now(sku) if request.query_params.get("nowait") else take(sku)
        return Response({"available": available})


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class RetryingTakeView(TakeView):
    """Opted out of ATOMIC_REQUESTS on the class, as docs/drf.md advises."""


urlpatterns = [
    path("take/<str:sku>/", TakeView.as_view()),
    # Opted out of ATOMIC_REQUESTS: the operation owns its transaction, so lockkit can retry it.
    path("retrying/<str:sku>/", transaction.non_atomic_requests(TakeView.as_view())),
    path("retrying-class/<str:sku>/", RetryingTakeView.as_view()),
]

HANDLER = {**settings.REST_FRAMEWORK, "EXCEPTION_HANDLER": "lockkit.contrib.drf.exception_handler"}


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    ATTEMPTS.clear()
    HOLDERS.clear()
    with override_settings(REST_FRAMEWORK=HANDLER):
        yield
    HOLDERS.clear()


@pytest.fixture
def atomic_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)


def test_a_lock_timeout_is_a_503_with_retry_after_and_the_next_request_works() -> None:
    stock = Stock.objects.create(sku="hot", available=5)
    client = APIClient()
    with hold_lock(stock):
        response = client.post("/take/hot/")
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response.json() == {"detail": "The data is busy (lock_timeout): try again in 1 second(s)."}
    assert ATTEMPTS == [1, 2, 3]  # not under ATOMIC_REQUESTS: retried, then given up
    response = client.post("/take/hot/")
    assert (response.status_code, response.json()) == (200, {"available": 4})


def test_a_nowait_failure_is_a_503_too() -> None:
    stock = Stock.objects.create(sku="hot", available=5)
    request = APIRequestFactory().post("/take/hot/?nowait=1")
    with hold_lock(stock):
        response = TakeView.as_view()(request, sku="hot")
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response.data["detail"].code == "lock_not_available"
    assert ATTEMPTS == [1]  # a NOWAIT failure is a request to fail fast: not retried


def test_under_atomic_requests_one_attempt_then_503_and_the_request_rolled_back(
    atomic_requests: None,
) -> None:
    stock = Stock.objects.create(sku="hot", available=5)
    with hold_lock(stock):
        response = APIClient().post("/take/hot/")
    assert response.status_code == 503
    assert ATTEMPTS == [1]  # nested in the request's transaction: no retry
    # The handler rolled the request's transaction back: the view's own write is gone.
    assert not Stock.objects.filter(sku__startswith="audit-").exists()
    assert Stock.objects.get(sku="hot").available == 5


@pytest.mark.parametrize("url", ["/retrying/hot/", "/retrying-class/hot/"], ids=["urls.py", "class"])
def test_a_view_opted_out_of_atomic_requests_is_retried(atomic_requests: None, url: str) -> None:
    stock = Stock.objects.create(sku="hot", available=5)
    with hold_lock(stock) as holder:
        HOLDERS.append(holder)  # released before the second attempt
        response = APIClient().post(url)
    assert (response.status_code, response.json()) == (200, {"available": 4})
    assert ATTEMPTS == [1, 2]
    assert Stock.objects.filter(sku="audit-0").exists()


def test_other_errors_go_to_drfs_own_handler(atomic_requests: None) -> None:
    response = APIClient().post("/take/missing/")
    assert (response.status_code, response.json()) == (404, {"detail": "no such stock"})
    assert "Retry-After" not in response
    assert not Stock.objects.filter(sku__startswith="audit-").exists()  # DRF's handler rolled back
    # Not an API error: DRF's handler returns None and Django answers 500; so does this one.
    assert drf.exception_handler(ValueError("boom"), {}) is None
    assert drf.exception_handler(lockkit.StatementTimeout("slow"), {}) is None  # not transient: no 503


def _wait_5(exc: Exception, context: dict[str, Any]) -> Response | None:
    return drf.exception_handler(exc, context, retry_after=5)


def test_retry_after_is_configurable() -> None:
    stock = Stock.objects.create(sku="hot", available=5)
    with (
        override_settings(REST_FRAMEWORK={**HANDLER, "EXCEPTION_HANDLER": f"{__name__}._wait_5"}),
        hold_lock(stock),
    ):
        response = APIClient().post("/take/hot/?nowait=1")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json() == {"detail": "The data is busy (lock_not_available): try again in 5 second(s)."}


@pytest.mark.parametrize(
    ("value", "error"),
    [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError), ("1", TypeError)],
)
def test_retry_after_refuses_bad_values(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="retry_after"):
        drf.exception_handler(ValueError("boom"), {}, retry_after=value)
