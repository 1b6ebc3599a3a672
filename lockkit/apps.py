"""The Django app of lockkit: optional, for its system checks and the ``lockkit_capabilities`` command.

``import lockkit`` works without it; add ``"lockkit"`` to ``INSTALLED_APPS`` for the checks and the command.
"""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks
from django.utils.module_loading import import_string

from lockkit import conf
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
        """Register the checks, and install the observers listed in ``settings.LOCKKIT["OBSERVERS"]``.

        The settings and configuration checks, and the (deploy-only) database capability check.

        Raises:
            TypeError: ``OBSERVERS`` is not a list or tuple of dotted paths.
            ImportError: a path cannot be imported.
        """
        checks.register(check_settings)
        checks.register(check_configuration)
        checks.register(check_memory_databases)
        checks.register(check_capabilities, checks.Tags.database, deploy=True)
        observers = conf.setting("OBSERVERS", ())
        if not isinstance(observers, list | tuple) or not all(isinstance(path, str) for path in observers):
            raise TypeError('settings.LOCKKIT["OBSERVERS"] must be a list of dotted paths to callables')
        for path in observers:
            import_string(path)()
