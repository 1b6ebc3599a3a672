"""A view for the ATOMIC_REQUESTS test (a locked operation nested in the request's transaction), and the admin."""

from __future__ import annotations

from django.apps import apps
from django.http import HttpRequest, JsonResponse
from django.urls import URLPattern, URLResolver, path

import lockkit
from lockkit_tests.models import Stock

ATTEMPTS: list[int] = []


@lockkit.locked_operation(lock_timeout=0.1)
def take(sku: str) -> int:
    ATTEMPTS.append(lockkit.current_scope().attempt)
    return lockkit.current_scope().get(Stock, sku=sku).available


def reserve_view(request: HttpRequest, sku: str) -> JsonResponse:
    Stock.objects.create(sku=f"audit-{len(ATTEMPTS)}", available=0)  # written by the request's transaction
    try:
        available = take(sku)
    except lockkit.LockTimeout as exc:
        return JsonResponse(
            {"error": exc.failure.value if exc.failure else "", "attempts": exc.attempts}, status=409
        )
    return JsonResponse({"available": available})


urlpatterns: list[URLPattern | URLResolver] = [path("reserve/<str:sku>/", reserve_view)]
if apps.is_installed("django.contrib.admin"):  # Django 6 runs (the tasks admin's tests)
    from django.contrib import admin

    urlpatterns.append(path("admin/", admin.site.urls))
