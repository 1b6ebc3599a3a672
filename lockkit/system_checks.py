"""Django system checks: ``settings.LOCKKIT``, where correctness needs configuration, and (deploy) capabilities.

Registered by ``lockkit.apps.LockkitConfig`` when ``"lockkit"`` is in ``INSTALLED_APPS``. Every command runs the
settings and configuration checks (errors and warnings only); the informational capability report is
``manage.py lockkit_capabilities``, and ``manage.py check --deploy --database ALIAS``.
https://docs.djangoproject.com/en/stable/topics/checks/
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Info, Warning
from django.db import connections
from django.utils.module_loading import import_string

from lockkit import conf
from lockkit.capabilities import (
    capabilities,
    configuration_warnings,
    memory_database_warnings,
    statement_timeout_warnings,
    topology_warnings,
)
from lockkit.links import docs_url
from lockkit.retries import check_retry
from lockkit.validation import optional_duration

_DURATION_KEYS = ("LOCK_TIMEOUT", "STATEMENT_TIMEOUT")


def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate ``settings.LOCKKIT``: ``lockkit.E001`` (not a dict), ``E002`` (unknown key), ``E003`` (bad value).

    ``lockkit.E004``: a path in ``OBSERVERS`` cannot be imported or is not callable (the app logs it and
    installs the others). The
    same rules the first locked call applies (``lockkit.conf``), found by ``manage.py check`` instead; each
    unknown key's hint names the closest valid key.
    """
    value = conf.raw_settings()
    if value is None:
        return []
    if not isinstance(value, dict):
        return [
            Error(
                f"settings.LOCKKIT must be a dict, not {type(value).__name__}",
                hint=f"Valid keys: {conf.valid_keys()}.",
                id="lockkit.E001",
            )
        ]
    messages: list[CheckMessage] = [
        Error(
            f"settings.LOCKKIT has an unknown key {key!r}", hint=conf.unknown_key_hint(key), id="lockkit.E002"
        )
        for key in value
        if key not in conf.KNOWN_KEYS
    ]
    for key in _DURATION_KEYS:
        if key in value:
            try:
                optional_duration(value[key], f"LOCKKIT[{key!r}]")
            except (TypeError, ValueError) as exc:
                messages.append(
                    Error(str(exc), hint="Seconds (int or float), a timedelta, or None.", id="lockkit.E003")
                )
    observers = value.get("OBSERVERS", [])
    if not conf.observers_are_paths(observers):
        messages.append(
            Error(
                "LOCKKIT['OBSERVERS'] must be a list of dotted paths to callables",
                hint='For example ["lockkit.contrib.prometheus.install"].',
                id="lockkit.E003",
            )
        )
    else:
        messages.extend(error for path in observers if (error := _unimportable(path)) is not None)
    if "ADVISORY_NAMESPACE" in value:
        try:
            conf.check_advisory_namespace(value["ADVISORY_NAMESPACE"])
        except (TypeError, ValueError) as exc:
            messages.append(
                Error(str(exc), hint="A non-empty str without NUL characters, or None.", id="lockkit.E003")
            )
    if "RETRY" in value:
        try:
            check_retry(value["RETRY"], "LOCKKIT['RETRY']")
        except (TypeError, ValueError) as exc:
            messages.append(
                Error(
                    str(exc),
                    hint="A lockkit.RetryPolicy, a dict of its arguments, a tenacity.Retrying, or None.",
                    id="lockkit.E003",
                )
            )
    return messages


def _unimportable(path: str) -> Error | None:
    """``lockkit.E004``: an ``OBSERVERS`` path that cannot be imported (hinting its module's closest name) or is not callable."""
    try:
        observer = import_string(path)
    except ImportError as exc:
        hint = ""
        module_path, _, name = path.rpartition(".")
        if module_path:
            try:
                module = importlib.import_module(module_path)
            except ImportError:
                pass
            else:
                names = [attr for attr in dir(module) if not attr.startswith("_")]
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"Did you mean {module_path}.{close[0]}? " if close else ""
        return Error(
            f"LOCKKIT['OBSERVERS'] names {path!r}, which cannot be imported: {exc}",
            hint=hint + 'A dotted path to a callable, e.g. "lockkit.contrib.prometheus.install".',
            id="lockkit.E004",
        )
    if not callable(observer):
        return Error(
            f"LOCKKIT['OBSERVERS'] names {path!r}, which is a {type(observer).__name__}, not a callable",
            hint='A dotted path to a callable, e.g. "lockkit.contrib.prometheus.install".',
            id="lockkit.E004",
        )
    return None


def check_memory_databases(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``lockkit.W003``: an in-memory SQLite database (or test database), where lock waits do not work."""
    return [
        Warning(
            text,
            hint=f"Set DATABASES[alias]['TEST']['NAME'] (and NAME) to a file path. See {docs_url('backends/', 'sqlite')}",
            obj=alias,
            id="lockkit.W003",
        )
        for alias in connections
        for text in memory_database_warnings(alias)
    ]


def check_configuration(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """``lockkit.W001``: a database setting lockkit's guarantees depend on (from settings, no connection).

    The hint links to the section that gives the setting: SQLite's for an SQLite alias, else the capability report.
    """
    return [
        Warning(
            text,
            hint=f"See {docs_url('backends/', _SECTIONS.get(connections[alias].vendor, 'the-capability-report'))}",
            obj=alias,
            id="lockkit.W001",
        )
        for alias in connections
        for text in configuration_warnings(alias)
    ]


# The section of docs/backends.md that says how to set what lockkit.W001 warns about, by vendor.
_SECTIONS = {"sqlite": "sqlite"}


def check_topology(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """``lockkit.W004``: a PostgreSQL alias that would not survive a failover or a dead peer (from settings)."""
    return [
        Warning(text, hint=f"See {docs_url('ha/')}", obj=alias, id="lockkit.W004")
        for alias in connections
        for text in topology_warnings(alias)
    ]


def check_capabilities(
    app_configs: Sequence[AppConfig] | None = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Report ``lockkit.I001`` per database asked for (``manage.py check --deploy --database ALIAS``).

    ``lockkit.W002`` when the server cannot be asked. A deployment database check: Django runs it only with
    ``--deploy`` and only for the aliases it is given, so ``migrate`` and ``runserver`` stay quiet.
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
        messages += [
            Warning(
                text,
                hint=f"See {docs_url('reliability/', 'cancels-and-timeouts')}",
                obj=alias,
                id="lockkit.W005",
            )
            for text in statement_timeout_warnings(alias)
        ]
    return messages
