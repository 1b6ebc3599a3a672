"""URL configuration: the inventory and jobs JSON endpoints, and ``/metrics`` for Prometheus."""

from __future__ import annotations

from django.urls import include, path

from sample_project.inventory.async_views import reserve_async
from sample_project.metrics import metrics

urlpatterns = [
    path("inventory/reserve-async", reserve_async, name="reserve-async"),
    path("metrics", metrics, name="metrics"),
    path("inventory/", include("sample_project.inventory.urls")),
    path("jobs/", include("sample_project.jobs.urls")),
]
