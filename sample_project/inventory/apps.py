from __future__ import annotations

from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "sample_project.inventory"
    label = "inventory"
    default_auto_field = "django.db.models.BigAutoField"
