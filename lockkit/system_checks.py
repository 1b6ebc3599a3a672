"""Django system checks: what lockkit can do on each database, and where correctness needs configuration.

Registered by ``lockkit.apps.LockkitConfig`` when ``"lockkit"`` is in ``INSTALLED_APPS``.
https://docs.djangoproject.com/en/stable/topics/checks/
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Info, Warning
from django.db import connections

from lockkit.capabilities import capabilities, configuration_warnings


def check_configuration(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """``lockkit.W001``: a database setting lockkit's guarantees depend on (from settings, no connection)."""
    return [
        Warning(text, hint="See docs/backends.md in lockkit.", obj=alias, id="lockkit.W001")
        for alias in connections
        for text in configuration_warnings(alias)
    ]


def check_capabilities(
    app_configs: Sequence[AppConfig] | None = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Report ``lockkit.I001`` per database asked for (``manage.py check --database ALIAS``).

    ``lockkit.W002`` when the server cannot be asked. A database check: Django runs it only for the aliases it is
    given.
    """
    messages: list[CheckMessage] = []
    for alias in databases or ():
        caps = capabilities(alias)
        if caps.error is not None:
            messages.append(Warning(f"cannot read capabilities: {caps.error}", obj=alias, id="lockkit.W002"))
            continue
        options = [
            name
            for name, present in (
                ("row locks", caps.row_locks),
                ("nowait", caps.nowait),
                ("skip_locked", caps.skip_locked),
                ("of", caps.of),
                ("no_key", caps.no_key),
            )
            if present
        ]
        messages.append(
            Info(
                f"lockkit on {caps.vendor}: {', '.join(options) or 'no row-lock options'}; "
                f"lock_timeout: {caps.lock_timeout or 'not applied'}; "
                f"statement_timeout: {caps.statement_timeout or 'not supported'}",
                obj=alias,
                id="lockkit.I001",
            )
        )
    return messages
