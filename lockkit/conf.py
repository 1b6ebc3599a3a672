"""The ``settings.LOCKKIT`` dict with its defaults, read lazily so ``override_settings`` works.

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

from typing import Any

from django.conf import settings

DEFAULT_LOCK_TIMEOUT = 5.0

#: The keys ``settings.LOCKKIT`` may hold (checked by ``manage.py check``, lockkit.E002).
KNOWN_KEYS = frozenset({"LOCK_TIMEOUT", "STATEMENT_TIMEOUT", "RETRY", "OBSERVERS"})
_MISSING = object()


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
