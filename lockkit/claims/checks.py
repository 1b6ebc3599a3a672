"""Validation of every ``lockkit.claims`` argument, done before any SQL runs; errors name the parameter."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import NotSupportedError, connections, models, router
from django.db.models import Q, QuerySet
from django.db.models.expressions import BaseExpression

from lockkit import aliases
from lockkit.claims.mixin import CLAIM_FIELDS, WORKER_MAX_LENGTH, Claimable
from lockkit.claims.value import Claim
from lockkit.validation import duration

SUPPORTED_VENDORS = frozenset({"postgresql"})


def claimable_model(model: object, name: str) -> type[Claimable]:
    """Return ``model`` when it is a concrete model class using the ``Claimable`` mixin."""
    if not (isinstance(model, type) and issubclass(model, models.Model)):
        raise TypeError(f"{name} must be a Claimable model, not {type(model).__name__}")
    if not issubclass(model, Claimable):
        raise TypeError(f"{name}: {model.__name__} does not use the lockkit.claims.Claimable mixin")
    if model._meta.abstract:
        raise TypeError(f"{name}: {model.__name__} is abstract; claim rows of a concrete model")
    holder = model._meta.get_field("claim_token").model
    if holder._meta.concrete_model is not model._meta.concrete_model:
        # Multi-table inheritance: the claim columns live in a parent's table, which one UPDATE cannot reach.
        raise TypeError(
            f"{name}: {model.__name__}'s claim fields live in the table of its parent {holder.__name__}; "
            f"claim {holder.__name__} rows instead"
        )
    return model


def worker(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"worker must be a str naming the worker, not {type(value).__name__}")
    if not value.strip():
        raise ValueError("worker must be a non-empty name")
    if len(value) > WORKER_MAX_LENGTH:
        raise ValueError(f"worker must be at most {WORKER_MAX_LENGTH} characters, got {len(value)}")
    if "\x00" in value:
        raise ValueError("worker must not contain NUL characters (PostgreSQL text cannot store them)")
    return value


def lease(value: object, name: str = "lease") -> float:
    return duration(value, name)


def positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    if value > _MAX_BIGINT:
        raise ValueError(f"{name} must be at most {_MAX_BIGINT} (a PostgreSQL bigint), got {value}")
    return value


# LIMIT takes a bigint.
_MAX_BIGINT = 2**63 - 1


def condition(value: object) -> Q | None:
    if value is not None and not isinstance(value, Q):
        raise TypeError(f"when must be a django.db.models.Q or None, not {type(value).__name__}")
    return value


def order(value: object) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(
            f"order_by must be a list or tuple of field names or expressions, not {type(value).__name__}"
        )
    for item in value:
        if not isinstance(item, str | BaseExpression):
            raise TypeError(f"order_by items must be field names or expressions, not {type(item).__name__}")
        if isinstance(item, BaseExpression) and (item.contains_aggregate or item.contains_over_clause):
            raise ValueError(
                "order_by must not use aggregates or window functions: rows cannot be locked then"
            )
    return tuple(value)


def assignments(model: type[Claimable], values: object, name: str) -> dict[str, Any]:
    """Return a ``set=`` mapping checked against ``model``: local, concrete, non-key, non-claim fields."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise TypeError(f"{name} must be a dict of field names to values, not {type(values).__name__}")
    checked: dict[str, Any] = {}
    for field_name, value in values.items():
        if not isinstance(field_name, str):
            raise TypeError(f"{name} keys must be field names (str), not {type(field_name).__name__}")
        try:
            field = model._meta.get_field(field_name)
        except Exception as exc:
            raise ValueError(f"{name}: {model.__name__} has no field {field_name!r}") from exc
        if not getattr(field, "concrete", False) or field.many_to_many or field.one_to_many:
            raise ValueError(f"{name}: {model.__name__}.{field_name} is not a column that can be set")
        if field.name in CLAIM_FIELDS or getattr(field, "attname", None) in CLAIM_FIELDS:
            raise ValueError(
                f"{name}: {field_name!r} is a claim field that lockkit maintains; it cannot be set"
            )
        if getattr(field, "primary_key", False):
            raise ValueError(f"{name}: the primary key {field_name!r} cannot be set")
        if field.model._meta.concrete_model is not model._meta.concrete_model:
            raise ValueError(
                f"{name}: {field_name!r} belongs to a parent model's table; set only local fields"
            )
        checked[field.name] = value
    return checked


def queryset(target: object, name: str = "queryset") -> QuerySet[Any]:
    """Return ``target`` (a queryset, a manager or a model class) as a queryset of a ``Claimable`` model."""
    if isinstance(target, type) and issubclass(target, models.Model):
        claimable_model(target, name)
        return target._default_manager.all()
    if isinstance(target, models.Manager):
        target = target.all()
    if not isinstance(target, QuerySet):
        raise TypeError(f"{name} must be a QuerySet of a Claimable model, not {type(target).__name__}")
    claimable_model(target.model, name)
    query = target.query
    if query.is_sliced:
        raise ValueError(f"{name} must not be sliced; pass limit= instead")
    if query.distinct:
        raise ValueError(f"{name} must not use distinct(): rows cannot be locked from a DISTINCT query")
    if query.combinator:
        raise ValueError(f"{name} must not be a union/intersection/difference of querysets")
    if query.group_by is not None or any(
        getattr(annotation, "contains_aggregate", False) for annotation in query.annotations.values()
    ):
        raise ValueError(
            f"{name} must not aggregate (GROUP BY): rows cannot be locked from a grouped query; "
            "filter with a subquery (pk__in=..., Exists(...)) instead"
        )
    return target


def bound_alias(queryset: QuerySet[Any]) -> str | None:
    """The alias a queryset was explicitly bound to (``.using()``, ``db_manager()``), or ``None``."""
    bound: str | None = getattr(queryset, "_db", None)
    return bound


def alias_for(using: object, queryset: QuerySet[Any], hint: models.Model | None = None) -> str:
    """The alias: ``using``, else the queryset's own (``.using()``, instance database), else the router's.

    Raises:
        AliasMismatch: ``using`` differs from the database the queryset is bound to.
        NotSupportedError: the alias is not a PostgreSQL database.
    """
    if using is not None:
        alias = aliases.check_alias(using)
    elif bound_alias(queryset) is not None:
        alias = str(bound_alias(queryset))
    else:
        kwargs = {"instance": hint} if hint is not None else {}
        alias = aliases.check_alias(
            router.db_for_write(queryset.model, **kwargs), "router.db_for_write(model)"
        )
    aliases.queryset_on(queryset, alias, "target" if hint is not None else "queryset")
    vendor = connections[alias].vendor
    if vendor not in SUPPORTED_VENDORS:
        raise NotSupportedError(f"lockkit.claims supports PostgreSQL only; database {alias!r} is {vendor}")
    return alias


def claims(values: object, name: str = "claims") -> tuple[Claim, ...]:
    """Return claims of one model on one alias, each row at most once."""
    if isinstance(values, Claim):
        raise TypeError(f"{name} must be an iterable of Claim objects; for one claim use the single form")
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be an iterable of Claim objects, not {type(values).__name__}")
    result = tuple(values)
    for item in result:
        claim(item, f"{name} item")
    if result:
        first = result[0]
        if any(c.model is not first.model or c.alias != first.alias for c in result):
            raise ValueError(f"{name} must all be claims of one model on one database alias")
        # Compared as the field reads them: 1 and "1" are the same row of an integer primary key.
        if len({_row_key(c) for c in result}) != len(result):
            raise ValueError(f"{name} holds the same row more than once")
    return result


def claim(value: object, name: str = "claim") -> Claim:
    if not isinstance(value, Claim):
        raise TypeError(f"{name} must be a Claim (from claim() or claim_next()), not {type(value).__name__}")
    claimable_model(value.model, f"{name}.model")
    # A Claim is plain data that may have travelled (pickled, JSON): check what the fenced write will use.
    if value.pk is None:
        raise ValueError(f"{name}.pk is None: a claim names a saved row")
    _row_key(value, name)
    token = value.token
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= _MAX_BIGINT:
        raise ValueError(f"{name}.token must be an int between 0 and {_MAX_BIGINT}, got {token!r}")
    if value.lease is not None:
        lease(value.lease, f"{name}.lease")
    return value


def _row_key(value: Claim, name: str = "claim") -> Any:
    """The claim's primary key as its model field reads it (``"1"`` and ``1`` alike for an integer key)."""
    pk_field = value.model._meta.pk
    assert pk_field is not None
    try:
        return pk_field.to_python(value.pk)
    except ValidationError as exc:
        raise ValueError(f"{name}.pk {value.pk!r} is not a valid {value.model.__name__} primary key") from exc
