"""Resolving the one database alias of a locked operation, and checking querysets against it.

https://docs.djangoproject.com/en/stable/topics/db/multi-db/#automatic-database-routing
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, models, router

from lockkit.errors import AliasMismatch


def check_alias(alias: object, name: str = "using") -> str:
    """Return ``alias`` when it names a configured database.

    Raises:
        TypeError: ``alias`` is not a string.
        ValueError: no database with that alias is configured in ``settings.DATABASES``.
    """
    if not isinstance(alias, str):
        raise TypeError(f"{name} must be a database alias (str), not {type(alias).__name__}")
    if alias not in connections.settings:
        configured = ", ".join(sorted(connections.settings))
        raise ValueError(f"{name}={alias!r} is not a configured database alias (configured: {configured})")
    return alias


def check_model(model: object, name: str = "model") -> type[models.Model] | None:
    """Return ``model`` when it is ``None`` or a Django model class.

    Raises:
        TypeError: ``model`` is an instance, a queryset or anything else.
    """
    if model is None or (isinstance(model, type) and issubclass(model, models.Model)):
        return model
    raise TypeError(f"{name} must be a Django model class, not {type(model).__name__}")


def resolve(using: str | None, model: type[models.Model] | None) -> str:
    """Return the alias: ``using`` when given, else ``router.db_for_write(model)``, else ``"default"``."""
    if using is not None:
        return check_alias(using)
    if model is not None:
        return check_alias(router.db_for_write(model), "router.db_for_write(model)")
    return DEFAULT_DB_ALIAS


def queryset_on(target: object, alias: str, name: str = "queryset") -> models.QuerySet[Any]:
    """Return ``target`` (a queryset or a model class) as a queryset bound to ``alias``.

    A queryset with no explicit database is bound to ``alias``; one already bound to another alias (``.using()``,
    ``db_manager()``) is refused before any SQL runs.

    Raises:
        TypeError: ``target`` is neither a queryset nor a model class (an instance, a manager, a list...).
        AliasMismatch: the queryset is bound to a different alias.
    """
    queryset, bound = _checked(target, alias, name)
    return queryset if bound == alias else queryset.using(alias)


def check_queryset_alias(target: object, alias: str, name: str = "queryset") -> None:
    """Check what ``queryset_on(target, alias, name)`` checks, without building a queryset.

    Raises:
        TypeError, AliasMismatch: as ``queryset_on``.
    """
    _checked(target, alias, name)


def locking_queryset_on(
    target: object, alias: str, name: str = "queryset", **select_for_update: Any
) -> models.QuerySet[Any]:
    """``queryset_on(target, alias).select_for_update(**select_for_update)``, cloning the caller's queryset once.

    Raises:
        TypeError, AliasMismatch: as ``queryset_on``.
    """
    queryset, _bound = _checked(target, alias, name)
    locked = queryset.select_for_update(**select_for_update)
    locked._db = alias  # type: ignore[attr-defined]  # what .using(alias) sets, on the clone made just above
    return locked


def _checked(target: object, alias: str, name: str) -> tuple[models.QuerySet[Any], str | None]:
    if isinstance(target, type) and issubclass(target, models.Model):
        queryset: models.QuerySet[Any] = target._default_manager.all()
    elif isinstance(target, models.QuerySet):
        queryset = target
    elif isinstance(target, models.Manager):
        queryset = target.all()
    else:
        raise TypeError(f"{name} must be a QuerySet or a model class, not {type(target).__name__}")
    bound: str | None = queryset._db  # type: ignore[attr-defined]  # the explicit alias, None if unbound
    if bound is not None and bound != alias:
        raise AliasMismatch(
            f"{name} for {queryset.model.__name__} is bound to database {bound!r}, but the locked scope is on "
            f"{alias!r}; a lock taken on another alias is outside this transaction",
            alias=alias,
        )
    return queryset, bound
