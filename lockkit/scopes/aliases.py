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


def routed_alias(model: type[models.Model], **hints: Any) -> str | None:
    """Return the alias a router chose for writes of ``model``, or ``None`` when every router leaves it unrouted.

    Unlike ``router.db_for_write`` (which falls back to ``"default"``), this tells "routed to default" apart from
    "no router has an opinion". See https://docs.djangoproject.com/en/stable/topics/db/multi-db/#db_for_write.
    """
    for each in router.routers:
        chooser = getattr(each, "db_for_write", None)
        if chooser is not None:
            chosen = chooser(model, **hints)
            if chosen:
                return str(chosen)
    return None


def check_routed(model: type[models.Model], alias: str, name: str = "model") -> None:
    """Refuse a model whose router sends its writes to another alias than ``alias`` (a scope's).

    Raises:
        AliasMismatch: a router chose another alias for ``model``.
    """
    _check_routed(model, alias, name)


def _check_routed(model: type[models.Model], alias: str, name: str, **hints: Any) -> None:
    """Refuse a model whose router sends its writes to another alias than the scope's.

    Raises:
        AliasMismatch: a router chose another alias for ``model``.
    """
    routed = routed_alias(model, **hints)
    if routed is not None and routed != alias:
        label = model.__name__
        raise AliasMismatch(
            f"{name}: {label} is routed to database {routed!r} (router.db_for_write), but the locked scope is "
            f"on {alias!r}; locking it here would query {alias!r}, not where its rows live. Lock it in a scope "
            f"on {routed!r} (locked(model={label}) or locked_operation(model={label})), or pass "
            f"{label}.objects.using({alias!r}) if its table really lives on {alias!r} too",
            alias=alias,
        )


def queryset_on(
    target: object, alias: str, name: str = "queryset", *, instances: bool = False, routed: bool = False
) -> models.QuerySet[Any]:
    """Return ``target`` (a queryset, a model class or, with ``instances``, a saved instance) bound to ``alias``.

    A queryset with no explicit database is bound to ``alias``; one already bound to another alias (``.using()``,
    ``db_manager()``) is refused before any SQL runs. An instance becomes the queryset of its own row. With
    ``routed``, a model class or an unbound queryset whose model a router sends elsewhere is refused too (an
    explicit ``.using(alias)``, or an instance read from ``alias``, is taken as meant).

    Raises:
        TypeError: ``target`` is none of the accepted kinds (an instance without ``instances``, a list...).
        ValueError: ``target`` is an unsaved instance.
        AliasMismatch: the queryset or instance is bound to a different alias, or (``routed``) routed elsewhere.
    """
    queryset = _checked(target, alias, name, instances=instances, routed=routed)
    return queryset if queryset._db == alias else queryset.using(alias)  # type: ignore[attr-defined]


def check_queryset_alias(
    target: object, alias: str, name: str = "queryset", *, instances: bool = False, routed: bool = False
) -> None:
    """Check what ``queryset_on`` checks, without binding a clone to ``alias``.

    Raises:
        TypeError, ValueError, AliasMismatch: as ``queryset_on``.
    """
    _checked(target, alias, name, instances=instances, routed=routed)


def locking_queryset_on(
    target: object,
    alias: str,
    name: str = "queryset",
    *,
    instances: bool = False,
    routed: bool = False,
    **select_for_update: Any,
) -> models.QuerySet[Any]:
    """``queryset_on(...).select_for_update(**select_for_update)``.

    Raises:
        TypeError, ValueError, AliasMismatch: as ``queryset_on``.
    """
    queryset = _checked(target, alias, name, instances=instances, routed=routed)
    locked = queryset.select_for_update(**select_for_update)
    return locked if queryset._db == alias else locked.using(alias)  # type: ignore[attr-defined]


def _checked(target: object, alias: str, name: str, *, instances: bool, routed: bool) -> models.QuerySet[Any]:
    """``target`` as a queryset (not yet bound to ``alias``), after every check of ``queryset_on``."""
    hints: dict[str, Any] = {}
    if isinstance(target, type) and issubclass(target, models.Model):
        queryset: models.QuerySet[Any] = target._default_manager.all()
        bound: str | None = None
    elif isinstance(target, models.QuerySet):
        queryset = target
        bound = queryset._db  # type: ignore[attr-defined]  # the explicit alias, None if unbound
    elif isinstance(target, models.Manager):
        queryset = target.all()
        bound = queryset._db  # type: ignore[attr-defined]
    elif instances and isinstance(target, models.Model):
        if target.pk is None or target._state.adding:
            raise ValueError(f"{name} is an unsaved {type(target).__name__}: it has no row to lock")
        queryset = type(target)._default_manager.filter(pk=target.pk)
        bound, hints = target._state.db, {"instance": target}
    else:
        kinds = (
            "a QuerySet, a model class or a saved model instance"
            if instances
            else "a QuerySet or a model class"
        )
        raise TypeError(f"{name} must be {kinds}, not {type(target).__name__}")
    if bound is not None and bound != alias:
        raise AliasMismatch(
            f"{name} for {queryset.model.__name__} is bound to database {bound!r}, but the locked scope is on "
            f"{alias!r}; a lock taken on another alias is outside this transaction",
            alias=alias,
        )
    if routed and bound is None:
        _check_routed(queryset.model, alias, name, **hints)
    return queryset
