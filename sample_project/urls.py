"""URL configuration: the inventory and jobs JSON endpoints."""

from __future__ import annotations

from django.urls import include, path

urlpatterns = [
    path("inventory/", include("sample_project.inventory.urls")),
    path("jobs/", include("sample_project.jobs.urls")),
]
