"""The ``settings.LOCKKIT`` dict with its defaults, read lazily and cached until the settings change.

Values are read on first use, validated, and kept until Django's ``setting_changed`` signal reports a change of
``LOCKKIT`` (``override_settings``, pytest-django's ``settings`` fixture), so a locked operation does not re-read and
re-validate its settings on every call. Changing ``settings.LOCKKIT`` at run time without that signal (mutating the
dict in place) is not seen until the next change is signalled.

Keys:
    ``LOCK_TIMEOUT`` (seconds, default 5.0): the ``lock_timeout`` of a scope that does not set one; ``None`` leaves
        the connection's own setting alone (not recommended: it is unbounded by default on PostgreSQL).
    ``STATEMENT_TIMEOUT`` (seconds, default ``None``): the ``statement_timeout`` of a scope that does not set one.
    ``RETRY``: the retry policy of a ``locked_operation`` that does not set one: a ``RetryPolicy``, a tenacity
        ``Retrying``, a dict of ``RetryPolicy`` keyword arguments, or ``None`` for no retries.
        Default: ``RetryPolicy()``.
    ``OBSERVERS`` (default ``[]``): dotted paths of callables run once, without arguments, when the ``lockkit``
        app is ready (it must be in ``INSTALLED_APPS``), e.g. ``"lockkit.contrib.prometheus.install"`` and
        ``"lockkit.contrib.otel.install"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.core.signals import setting_changed

T = TypeVar("T")

DEFAULT_LOCK_TIMEOUT = 5.0

#: The keys ``settings.LOCKKIT`` may hold (checked by ``manage.py check``, lockkit.E002).
KNOWN_KEYS = frozenset({"LOCK_TIMEOUT", "STATEMENT_TIMEOUT", "RETRY", "OBSERVERS", "LOCKS_PRESETS"})
_MISSING = object()

# (name, converter) -> the converted value; emptied whenever LOCKKIT changes. Only successful conversions are kept,
# so a bad setting raises on every call that reads it.
_resolved: dict[tuple[str, Callable[[Any], Any]], Any] = {}


def _user_settings() -> dict[str, Any]:
    value = getattr(settings, "LOCKKIT", None) or {}
    if not isinstance(value, dict):
        raise TypeError(f"settings.LOCKKIT must be a dict, got {type(value).__name__}")
    unknown = set(value) - KNOWN_KEYS
    if unknown:
        raise ValueError(f"settings.LOCKKIT has unknown keys {sorted(unknown)}; known: {sorted(KNOWN_KEYS)}")
    return value


def raw_settings() -> object:
    """Return ``settings.LOCKKIT`` as configured (``None`` when absent), unchecked: for the system checks."""
    return getattr(settings, "LOCKKIT", None)


def setting(name: str, default: Any) -> Any:
    """Return ``settings.LOCKKIT[name]``, or ``default`` when the key is absent."""
    value = _user_settings().get(name, _MISSING)
    return default if value is _MISSING else value


def resolved(name: str, default: Any, convert: Callable[[Any], T]) -> T:
    """Return ``convert(setting(name, default))``, computed once per settings change.

    Raises:
        TypeError, ValueError: ``settings.LOCKKIT`` is not a dict, has unknown keys, or ``convert`` refuses the
            value (raised on every call until the setting is fixed).
    """
    key = (name, convert)
    try:
        value: T = _resolved[key]
    except KeyError:
        value = _resolved[key] = convert(setting(name, default))
    return value


def _invalidate(*, setting: str, **kwargs: Any) -> None:
    if setting == "LOCKKIT":
        _resolved.clear()


setting_changed.connect(_invalidate, dispatch_uid="lockkit.conf.invalidate")
