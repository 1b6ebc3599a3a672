"""Inventory JSON endpoints.

``reserve`` and ``order`` own their transactions (``non_atomic_requests``), so lockkit retries them in fresh
transactions. ``reserve_in_request`` runs inside the request's transaction (``ATOMIC_REQUESTS``): lockkit
makes one attempt there and never retries inside it, so the view answers at once with 409/503 and the client
decides.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from lockkit import LockError
from sample_project.api import error_response, json_errors, parse_body
from sample_project.inventory.bodies import OrderBody, ReserveBody, ReserveInRequestBody
from sample_project.inventory.guarded import reserve_stock_guarded
from sample_project.inventory.handwritten import reserve_stock_by_hand
from sample_project.inventory.models import Stock
from sample_project.inventory.naive import reserve_stock_naive
from sample_project.inventory.services import reserve_order, reserve_stock

IMPLEMENTATIONS: dict[str, Callable[[str, int], int]] = {
    "lockkit": reserve_stock,
    "guarded": reserve_stock_guarded,
    "hand": reserve_stock_by_hand,  # for the demo's comparison: what lockkit replaces
    "naive": reserve_stock_naive,  # for the demo's comparison only
}


@require_GET
@transaction.non_atomic_requests
@json_errors
def stock(request: HttpRequest, sku: str) -> JsonResponse:
    """``GET /inventory/stock/<sku>``: ``{"sku", "available"}``."""
    row = Stock.objects.get(pk=sku)
    return JsonResponse({"sku": row.sku, "available": row.available})


@require_POST
@transaction.non_atomic_requests
@json_errors
def reserve(request: HttpRequest) -> JsonResponse:
    """``POST /inventory/reserve`` ``{"sku", "quantity", "impl"?}``: ``{"sku", "remaining"}``.

    ``impl`` is ``"lockkit"`` (default, ``locked_update``), ``"guarded"`` (``guarded_update``), ``"hand"``
    (hand-written ``select_for_update``) or ``"naive"`` (the demo compares them).
    """
    body = parse_body(request, ReserveBody)
    remaining = IMPLEMENTATIONS[body.impl](body.sku, body.quantity)
    return JsonResponse({"sku": body.sku, "remaining": remaining})


@require_POST
@transaction.non_atomic_requests
@json_errors
def order(request: HttpRequest) -> JsonResponse:
    """``POST /inventory/orders`` ``{"lines": [[sku, quantity], ...]}``: ``{"remaining": {sku: units}}``."""
    return JsonResponse({"remaining": reserve_order(parse_body(request, OrderBody).lines)})


@require_POST
@json_errors
def reserve_in_request(request: HttpRequest) -> JsonResponse:
    """``POST /inventory/reserve-in-request``: ``reserve`` inside the request transaction (ATOMIC_REQUESTS).

    The reservation is nested in the request's ``atomic()``, so lockkit makes exactly one attempt: a held row
    answers 409 ``lock_not_available`` at once with ``"nowait": true``, or 503 ``lock_timeout`` after the lock
    timeout; both with ``Retry-After``. The failed attempt rolled back its savepoint only, so the request's
    transaction is still usable: the error body reports the stock as this transaction reads it.
    """
    body = parse_body(request, ReserveInRequestBody)
    try:
        remaining = reserve_stock(body.sku, body.quantity, nowait=body.nowait)
    except LockError as exc:
        # Still inside the request transaction, which the failed nested attempt left usable: read from it.
        available = Stock.objects.filter(pk=body.sku).values_list("available", flat=True).first()
        response = error_response(exc, available=available, retried_inside_request=False)
        if response is None:
            raise
        return response
    return JsonResponse({"sku": body.sku, "remaining": remaining})
