from __future__ import annotations

from django.apps import AppConfig


class SoakConfig(AppConfig):
    name = "lockkit_harness.soak"
    label = "soak"
    default_auto_field = "django.db.models.BigAutoField"
