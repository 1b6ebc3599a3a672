"""A scope's configuration, validated once into one frozen ``ScopeOptions`` (the sentinels are ``lockkit.conf``'s)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.signals import setting_changed
from django.db import models

from lockkit import conf
from lockkit.conf import FROM_SETTINGS, NOT_GIVEN, Default
from lockkit.scopes import aliases
from lockkit.validation import Duration, flag, optional_duration

__all__ = ["FROM_SETTINGS", "NOT_GIVEN", "Default", "ScopeOptions"]


@dataclass(frozen=True)
class ScopeOptions:
    """A scope's validated configuration, shared by every call of a ``Locked`` or a ``locked_operation``.

    Attributes:
        using: An alias, ``None`` (the model's router, else ``"default"``) or a callable of the call's arguments.
        model: The model whose ``router.db_for_write`` gives the alias when ``using`` is ``None``.
        lock_timeout: Seconds, ``None`` (leave the connection's setting) or ``Default.FROM_SETTINGS``.
        statement_timeout: Seconds, ``None`` or ``Default.FROM_SETTINGS``.
        nowait: Lock with ``NOWAIT``.
        skip_locked: Lock with ``SKIP LOCKED``.
        no_key: Lock with ``FOR NO KEY UPDATE``.
    """

    using: str | Callable[..., str] | None = None
    model: type[models.Model] | None = None
    lock_timeout: float | Default | None = Default.FROM_SETTINGS
    statement_timeout: float | Default | None = Default.FROM_SETTINGS
    nowait: bool = False
    skip_locked: bool = False
    no_key: bool = False

    @classmethod
    def build(
        cls,
        using: object = None,
        *,
        model: object = None,
        lock_timeout: object = FROM_SETTINGS,
        statement_timeout: object = FROM_SETTINGS,
        nowait: object = False,
        skip_locked: object = False,
        no_key: object = False,
        allow_callable: bool = False,
    ) -> ScopeOptions:
        """Validate the options, naming the parameter at fault, before any SQL runs.

        Args:
            using: An alias, ``None``, or (with ``allow_callable``) a callable returning one.
            model: A model class or ``None``.
            lock_timeout: A duration, ``None`` or ``FROM_SETTINGS``.
            statement_timeout: A duration, ``None`` or ``FROM_SETTINGS``.
            nowait: A ``bool``.
            skip_locked: A ``bool``.
            no_key: A ``bool``.
            allow_callable: Whether ``using`` may be an alias resolver (``locked_operation`` only).

        Returns:
            The frozen options.

        Raises:
            TypeError: a parameter has the wrong type.
            ValueError: an unknown alias, a bad duration, ``nowait`` together with ``skip_locked``.
        """
        arguments = (
            using,
            model,
            lock_timeout,
            statement_timeout,
            nowait,
            skip_locked,
            no_key,
            allow_callable,
        )
        try:
            hash(arguments)
        except TypeError:  # an unhashable argument (refused below, by name): validate without the cache
            return cls._validated(*arguments)
        # The same arguments validate to the same frozen options: a ``with locked(...)`` written inline in a hot
        # path validates once (per type of each argument, and until DATABASES or LOCKKIT change).
        return _build_cached(*arguments)

    @classmethod
    def _validated(
        cls,
        using: object,
        model: object,
        lock_timeout: object,
        statement_timeout: object,
        nowait: object,
        skip_locked: object,
        no_key: object,
        allow_callable: bool,
    ) -> ScopeOptions:
        if using is not None and not isinstance(using, str) and not (allow_callable and callable(using)):
            kinds = (
                "a database alias (str), a callable returning one,"
                if allow_callable
                else "a database alias (str)"
            )
            raise TypeError(f"using must be {kinds} or None, not {type(using).__name__}")
        if isinstance(using, str):
            aliases.check_alias(using)
        checked_model = aliases.check_model(model)
        nowait_ = flag(nowait, "nowait")
        skip_locked_ = flag(skip_locked, "skip_locked")
        no_key_ = flag(no_key, "no_key")
        if nowait_ and skip_locked_:
            raise ValueError("nowait and skip_locked are mutually exclusive")
        return cls(
            using=using,  # checked above: str, None or a callable
            model=checked_model,
            lock_timeout=_timeout(lock_timeout, "lock_timeout"),
            statement_timeout=_timeout(statement_timeout, "statement_timeout"),
            nowait=nowait_,
            skip_locked=skip_locked_,
            no_key=no_key_,
        )

    def timeouts(self) -> tuple[float | None, float | None]:
        """Resolve the timeouts in seconds; settings are read once per settings change (``conf.resolved``).

        Raises:
            TypeError, ValueError: a ``LOCKKIT`` setting is not a valid duration.
        """
        return (
            _resolve(self.lock_timeout, "LOCK_TIMEOUT", conf.DEFAULT_LOCK_TIMEOUT),
            _resolve(self.statement_timeout, "STATEMENT_TIMEOUT", None),
        )

    def alias_for_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Resolve the alias one call runs on.

        Raises:
            TypeError, ValueError: the alias resolver returned something that is not a known alias.
        """
        if callable(self.using):
            return aliases.check_alias(self.using(*args, **kwargs), "the alias returned by using(...)")
        return aliases.resolve(self.using, self.model)


@functools.lru_cache(maxsize=1024, typed=True)
def _build_cached(*arguments: Any) -> ScopeOptions:
    return ScopeOptions._validated(*arguments)


def _forget_built(*, setting: str, **kwargs: Any) -> None:
    if setting in {"DATABASES", "LOCKKIT"}:  # an alias checked earlier may be gone
        _build_cached.cache_clear()


setting_changed.connect(_forget_built, dispatch_uid="lockkit.scopes.options.forget_built")


def _timeout(value: object, name: str) -> float | Default | None:
    return Default.FROM_SETTINGS if value is Default.FROM_SETTINGS else optional_duration(value, name)


def _resolve(value: float | Default | None, setting: str, default: object) -> float | None:
    if isinstance(value, Default):
        return conf.resolved(setting, default, _SETTING_CHECKS[setting])
    return value


def _lock_timeout_setting(value: object) -> float | None:
    return optional_duration(value, "LOCKKIT['LOCK_TIMEOUT']")


def _statement_timeout_setting(value: object) -> float | None:
    return optional_duration(value, "LOCKKIT['STATEMENT_TIMEOUT']")


# One converter object per setting, so conf.resolved caches each setting's checked value once per settings change.
_SETTING_CHECKS = {"LOCK_TIMEOUT": _lock_timeout_setting, "STATEMENT_TIMEOUT": _statement_timeout_setting}


__all__ = ["FROM_SETTINGS", "NOT_GIVEN", "Default", "Duration", "ScopeOptions"]
