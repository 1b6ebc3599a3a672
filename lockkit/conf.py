"""The ``settings.LOCKKIT`` dict with its defaults, read lazily and cached until the settings change.

Values are read on first use, validated, and kept until Django's ``setting_changed`` signal reports a change of
``LOCKKIT`` (``override_settings``, pytest-django's ``settings`` fixture), so a locked operation does not re-read and
re-validate its settings on every call. Changing ``settings.LOCKKIT`` at run time without that signal (mutating the
dict in place) is not seen until the next change is signalled.

A bad ``LOCKKIT`` never stops Django from loading: ``manage.py check`` (and every command that runs the checks)
reports it as ``lockkit.E001``-``E004`` (``lockkit.system_checks``), and every lockkit call that reads the settings
raises ``SettingTypeError``/``SettingValueError`` with the same message (Django's ``ImproperlyConfigured``, and a
``TypeError``/``ValueError`` as well): a server that runs no checks (gunicorn, uvicorn) fails at the first locked
call rather than run with defaults it was not given.

Keys:
    ``LOCK_TIMEOUT`` (seconds, default 5.0): the ``lock_timeout`` of a scope that does not set one; ``None`` leaves
        the connection's own setting alone (not recommended: it is unbounded by default on PostgreSQL).
    ``STATEMENT_TIMEOUT`` (seconds, default ``None``): the ``statement_timeout`` of a scope that does not set one.
    ``RETRY``: the retry policy of a ``locked_operation`` or ``guarded_update`` that does not set one, and of the
        claims calls and ``advisory_lock`` (with their own retried kinds; its ``reconnect_within`` bounds how long
        every one of them retries a lost or refused connection): a ``RetryPolicy``, a tenacity ``Retrying``, a dict
        of ``RetryPolicy`` keyword arguments, or ``None`` for no retries. Read through
        ``lockkit.retries.from_settings``. Default: ``RetryPolicy()``.
    ``ADVISORY_NAMESPACE`` (default ``None``): a per-project namespace mixed into the hash of every ``str`` advisory
        key (and ``(namespace, key)`` pair with a ``str`` in it), so that another account of the same server cannot
        take the project's keys without knowing it; ``None`` keeps django-pglock's hash. A non-empty ``str``
        without NUL characters; read by ``advisory_namespace()``.
    ``OBSERVERS`` (default ``[]``): dotted paths of callables run once, without arguments, when the ``lockkit``
        app is ready (it must be in ``INSTALLED_APPS``), e.g. ``"lockkit.contrib.prometheus.install"`` and
        ``"lockkit.contrib.otel.install"``.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed


class Default(enum.Enum):
    """The sentinels of arguments left out: one style for every default lockkit resolves itself."""

    FROM_SETTINGS = "<default from settings.LOCKKIT>"
    NOT_GIVEN = "<not given>"

    def __repr__(self) -> str:
        """Show what the default means, as signatures print it."""
        return self.value


# Typed ``Any`` so the public signatures keep their documented types (``float | int | timedelta | None``).
FROM_SETTINGS: Any = Default.FROM_SETTINGS
NOT_GIVEN: Any = Default.NOT_GIVEN


T = TypeVar("T")

DEFAULT_LOCK_TIMEOUT = 5.0

#: The keys ``settings.LOCKKIT`` may hold (checked by ``manage.py check``, lockkit.E002).
KNOWN_KEYS = frozenset(
    {"LOCK_TIMEOUT", "STATEMENT_TIMEOUT", "RETRY", "OBSERVERS", "LOCKS_PRESETS", "ADVISORY_NAMESPACE"}
)
_MISSING = object()

# (name, converter) -> the converted value; emptied whenever LOCKKIT changes. Only successful conversions are kept,
# so a bad setting raises on every call that reads it.
_resolved: dict[tuple[str, Callable[[Any], Any]], Any] = {}


class SettingTypeError(ImproperlyConfigured, TypeError):
    """``settings.LOCKKIT`` (or one of its values) has the wrong type; ``manage.py check`` names it too."""


class SettingValueError(ImproperlyConfigured, ValueError):
    """``settings.LOCKKIT`` has an unknown key or a value lockkit refuses; ``manage.py check`` names it too."""


def valid_keys() -> str:
    """The valid keys of ``settings.LOCKKIT``, for messages: ``"LOCK_TIMEOUT, OBSERVERS, ..."``."""
    return ", ".join(sorted(KNOWN_KEYS))


def closest_key(key: object) -> str | None:
    """The valid key an unknown one was probably meant to be (``difflib``, ignoring case), or ``None``."""
    close = difflib.get_close_matches(str(key).upper(), sorted(KNOWN_KEYS), n=1)
    return close[0] if close else None


def unknown_key_hint(key: object) -> str:
    """``"Did you mean 'LOCK_TIMEOUT'? Valid keys: ..."``: the hint for an unknown key, at run time and in checks."""
    close = closest_key(key)
    return (f"Did you mean {close!r}? " if close else "") + f"Valid keys: {valid_keys()}."


def observers_are_paths(value: object) -> bool:
    """Whether ``OBSERVERS`` has its documented shape: a list or tuple of dotted paths (strings)."""
    return isinstance(value, list | tuple) and all(isinstance(path, str) for path in value)


def _user_settings() -> dict[str, Any]:
    value = getattr(settings, "LOCKKIT", None)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SettingTypeError(
            f"settings.LOCKKIT must be a dict, not {type(value).__name__} (lockkit.E001). Valid keys: {valid_keys()}."
        )
    for key in value:
        if key not in KNOWN_KEYS:
            raise SettingValueError(
                f"settings.LOCKKIT has an unknown key {key!r} (lockkit.E002). {unknown_key_hint(key)}"
            )
    if not observers_are_paths(value.get("OBSERVERS", [])):
        raise SettingTypeError(
            "LOCKKIT['OBSERVERS'] must be a list of dotted paths to callables (lockkit.E003), "
            f"not {type(value['OBSERVERS']).__name__}"
        )
    return value


def raw_settings() -> object:
    """Return ``settings.LOCKKIT`` as configured (``None`` when absent), unchecked: for the system checks."""
    return getattr(settings, "LOCKKIT", None)


def setting(name: str, default: Any) -> Any:
    """Return ``settings.LOCKKIT[name]``, or ``default`` when the key is absent.

    Raises:
        SettingTypeError: ``settings.LOCKKIT`` is not a dict, or ``OBSERVERS`` is not a list of dotted paths.
        SettingValueError: ``settings.LOCKKIT`` has an unknown key.
    """
    value = _user_settings().get(name, _MISSING)
    return default if value is _MISSING else value


def resolved(name: str, default: Any, convert: Callable[[Any], T]) -> T:
    """Return ``convert(setting(name, default))``, computed once per settings change.

    Raises:
        SettingTypeError: ``settings.LOCKKIT`` is not a dict, ``OBSERVERS`` is not a list of dotted paths, or
            ``convert`` refuses the value's type (raised on every call until the setting is fixed).
        SettingValueError: ``settings.LOCKKIT`` has an unknown key (the message names the closest valid one), or
            ``convert`` refuses the value.
    """
    key = (name, convert)
    try:
        value: T = _resolved[key]
    except KeyError:
        raw = setting(name, default)
        try:
            value = convert(raw)
        except TypeError as exc:
            raise SettingTypeError(str(exc)) from exc
        except ValueError as exc:
            raise SettingValueError(str(exc)) from exc
        _resolved[key] = value
    return value


def check_advisory_namespace(value: object) -> str | None:
    """Validate ``LOCKKIT['ADVISORY_NAMESPACE']``: ``None``, or a non-empty ``str`` without NUL, encodable as UTF-8.

    Raises:
        TypeError: neither ``None`` nor a ``str``.
        ValueError: an empty string, a NUL character (the separator of the hashed text), or a lone surrogate.
    """
    name = "LOCKKIT['ADVISORY_NAMESPACE']"
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be an empty string (None keeps the default keys)")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} must be encodable as UTF-8: {exc}") from None
    return value


def advisory_namespace() -> str | None:
    """Return ``settings.LOCKKIT["ADVISORY_NAMESPACE"]``, validated (default ``None``).

    Raises:
        SettingTypeError: it is neither ``None`` nor a ``str`` (the message names the setting).
        SettingValueError: it is empty, contains NUL, or is not encodable as UTF-8.
    """
    return resolved("ADVISORY_NAMESPACE", None, check_advisory_namespace)


def _invalidate(*, setting: str, **kwargs: Any) -> None:
    if setting == "LOCKKIT":
        _resolved.clear()


setting_changed.connect(_invalidate, dispatch_uid="lockkit.conf.invalidate")
