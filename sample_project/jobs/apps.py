from __future__ import annotations

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "sample_project.jobs"
    label = "jobs"
    default_auto_field = "django.db.models.BigAutoField"
