from __future__ import annotations

from django.urls import path

from sample_project.inventory import views

app_name = "inventory"
urlpatterns = [
    path("stock/<str:sku>", views.stock, name="stock"),
    path("reserve", views.reserve, name="reserve"),
    path("orders", views.order, name="order"),
    path("reserve-in-request", views.reserve_in_request, name="reserve-in-request"),
]
