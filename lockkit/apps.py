"""The Django app of lockkit: optional, for its system checks and the ``lockkit_capabilities`` command.

``import lockkit`` works without it; add ``"lockkit"`` to ``INSTALLED_APPS`` for the checks and the command.
"""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks

from lockkit.system_checks import (
    check_capabilities,
    check_configuration,
    check_memory_databases,
    check_settings,
)


class LockkitConfig(AppConfig):
    """lockkit's app config: registers the system checks."""

    name = "lockkit"
    verbose_name = "lockkit"

    def ready(self) -> None:
        """Register the settings and configuration checks, and the (deploy-only) database capability check."""
        checks.register(check_settings)
        checks.register(check_configuration)
        checks.register(check_memory_databases)
        checks.register(check_capabilities, checks.Tags.database, deploy=True)
