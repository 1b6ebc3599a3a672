"""The Django app of lockkit: optional, for its system checks and the ``lockkit_capabilities`` command.

``import lockkit`` works without it; add ``"lockkit"`` to ``INSTALLED_APPS`` for the checks and the command.
"""

from __future__ import annotations

import logging
from importlib import import_module

import django
from django.apps import AppConfig
from django.core import checks
from django.utils.module_loading import import_string

from lockkit import conf
from lockkit._engine import forks
from lockkit.system_checks import (
    check_capabilities,
    check_configuration,
    check_memory_databases,
    check_settings,
    check_topology,
)

logger = logging.getLogger("lockkit")


class LockkitConfig(AppConfig):
    """lockkit's app config: registers the system checks."""

    name = "lockkit"
    verbose_name = "lockkit"

    def ready(self) -> None:
        """Register the checks, guard forked children's connections, and install the observers listed in ``settings.LOCKKIT["OBSERVERS"]``.

        The settings and configuration checks, and the (deploy-only) database capability check. A bad
        ``LOCKKIT`` never stops the app from loading: the checks report it (``lockkit.E001``-``E004``) and
        lockkit's calls refuse it. Observers are installed only when ``OBSERVERS`` is a list of dotted paths
        in a ``LOCKKIT`` dict; a path that cannot be imported, or names something that is not callable, is logged
        (ERROR, the ``lockkit`` logger), reported by ``lockkit.E004`` and skipped.

        Raises:
            Exception: what an observer's module raises when imported (other than ``ImportError``), or the
                observer when called: its own failure, not a setting's.
        """
        forks.install()  # a forked child never uses its parent's database sessions (lockkit._engine.forks)
        if django.VERSION >= (6, 0):
            # Django registers its check of the TASKS backends when django.tasks is imported, which nothing may
            # have done yet: then a lockkit.tasks backend without its app would pass `manage.py check`
            # (lockkit.tasks.E001).
            import_module("django.tasks")
        checks.register(check_settings)
        checks.register(check_configuration)
        checks.register(check_topology)
        checks.register(check_memory_databases)
        checks.register(check_capabilities, checks.Tags.database, deploy=True)
        value = conf.raw_settings()
        observers = value.get("OBSERVERS", ()) if isinstance(value, dict) else ()
        if not conf.observers_are_paths(observers):
            return  # lockkit.E003, and every locked call raises SettingTypeError
        for path in observers:
            try:
                observer = import_string(path)
            except ImportError as exc:
                problem = f"which cannot be imported ({exc})"
            else:
                if callable(observer):
                    observer()
                    continue
                problem = f"which is a {type(observer).__name__}, not a callable"
            logger.error(
                "lockkit: settings.LOCKKIT['OBSERVERS'] names %r, %s: not installed; see `manage.py check` "
                "(lockkit.E004)",
                path,
                problem,
            )
