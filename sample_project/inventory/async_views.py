"""An async endpoint: ``POST /inventory/reserve-async`` awaits the same reservation as ``reserve``.

An async view cannot run a transaction itself: it awaits the synchronous ``reserve_stock`` whole on one thread
(``lockkit.aio.awaitable``, the bridge behind ``locked_operation(...).acall``). It opts out of ``ATOMIC_REQUESTS``,
which Django refuses for async views, so lockkit owns the transaction and retries it. See docs/async.md.
"""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from lockkit.aio import awaitable
from sample_project.api import error_response, json_body
from sample_project.inventory.services import reserve_stock

areserve_stock = awaitable(reserve_stock)


@transaction.non_atomic_requests
async def reserve_async(request: HttpRequest) -> JsonResponse:
    """``POST /inventory/reserve-async`` ``{"sku", "quantity"}``: ``{"sku", "remaining"}``; errors as ``reserve``."""
    if request.method != "POST":
        return JsonResponse({"error": "method_not_allowed"}, status=405)
    try:
        data = json_body(request)
        remaining = await areserve_stock(data.get("sku"), data.get("quantity"))  # type: ignore[arg-type]
    except Exception as exc:
        response = error_response(exc)
        if response is None:
            raise
        return response
    return JsonResponse({"sku": data["sku"], "remaining": remaining})
