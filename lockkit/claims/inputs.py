"""Validation of every ``lockkit.claims`` argument, done before any SQL runs; errors name the parameter."""

from __future__ import annotations

import math
import uuid
from collections.abc import Hashable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from django.core.exceptions import FieldError, ValidationError
from django.db import connections, models, router
from django.db.models import CompositePrimaryKey, DecimalField, Field, ForeignObject, Model, Q, QuerySet
from django.db.models.sql import UpdateQuery

from lockkit.claims.mixin import Claimable
from lockkit.claims.sql.base import identical
from lockkit.claims.sql.table import CLAIM_FIELDS, WORKER_MAX_LENGTH
from lockkit.claims.value import Claim
from lockkit.errors import AliasMismatch
from lockkit.scopes import aliases
from lockkit.validation import duration
from lockkit.validation import positive_int as _positive_int


def claimable_model(model: object, name: str) -> type[Claimable]:
    """Return ``model`` when it is a concrete model class using the ``Claimable`` mixin, with a one-column key.

    Raises:
        TypeError: not a model class, no ``Claimable`` mixin, abstract, claim fields in a parent's table, or a
            ``CompositePrimaryKey``.
    """
    if not (isinstance(model, type) and issubclass(model, models.Model)):
        raise TypeError(f"{name} must be a Claimable model, not {type(model).__name__}")
    if not issubclass(model, Claimable):
        raise TypeError(f"{name}: {model.__name__} does not use the lockkit.claims.Claimable mixin")
    if model._meta.abstract:
        raise TypeError(f"{name}: {model.__name__} is abstract; claim rows of a concrete model")
    if isinstance(model._meta.pk, CompositePrimaryKey):
        # A claim names its row by one value, and the claims statements join and fence on one key column.
        raise TypeError(
            f"{name}: {model.__name__} has a composite primary key (CompositePrimaryKey of "
            f"{', '.join(model._meta.pk.field_names)}); lockkit.claims needs a single-column primary key"
        )
    holder = model._meta.get_field("claim_token").model
    if holder._meta.concrete_model is not model._meta.concrete_model:
        # Multi-table inheritance: the claim columns live in a parent's table, which one UPDATE cannot reach.
        raise TypeError(
            f"{name}: {model.__name__}'s claim fields live in the table of its parent {holder.__name__}; "
            f"claim {holder.__name__} rows instead"
        )
    return model


def worker(value: object, name: str = "worker") -> str:
    """Return ``value`` when it is a worker name ``claimed_by`` stores unchanged.

    Raises:
        TypeError: not a ``str``.
        ValueError: empty, too long, or with characters the database cannot store.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str naming the worker, not {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{name} must be a non-empty name")
    if len(value) > WORKER_MAX_LENGTH:
        raise ValueError(f"{name} must be at most {WORKER_MAX_LENGTH} characters, got {len(value)}")
    return check_text(value, name)


def lease(value: object, name: str = "lease") -> float:
    """Return ``value`` (seconds or a ``timedelta``) as a positive, finite number of seconds.

    Raises:
        TypeError, ValueError: as ``lockkit.validation.duration``.
    """
    return duration(value, name)


def positive_int(value: object, name: str) -> int:
    """Return ``value`` when it is an ``int`` (not a ``bool``) from 1 to the largest bigint (``LIMIT`` takes one).

    Raises:
        TypeError: not an ``int``.
        ValueError: out of range.
    """
    return _positive_int(value, name, maximum=_MAX_BIGINT, bound=" (a PostgreSQL bigint)")


_MAX_BIGINT = 2**63 - 1


def condition(value: object, queryset: QuerySet[Any]) -> QuerySet[Any]:
    """Return ``queryset`` filtered by ``when`` (a ``Q`` or ``None``).

    Raises:
        TypeError: ``when`` is not a ``Q`` or ``None``.
        ValueError: ``when`` names a field the model does not have, or uses an aggregate or window function.
    """
    if value is None:
        return queryset
    if not isinstance(value, Q):
        raise TypeError(f"when must be a django.db.models.Q or None, not {type(value).__name__}")
    try:
        filtered = queryset.filter(value)
    except FieldError as exc:
        raise ValueError(f"when: {exc}") from None
    if filtered.query.where.contains_aggregate or filtered.query.where.contains_over_clause:
        raise ValueError("when must not use aggregates or window functions: rows cannot be locked then")
    return filtered


def order(value: object, queryset: QuerySet[Any]) -> QuerySet[Any]:
    """Return ``queryset`` ordered by ``order_by``: field names and expressions, as ``QuerySet.order_by()``.

    Default (``None``): the queryset's own ordering, else the primary key.

    Raises:
        TypeError: not a list or tuple of field names and expressions.
        ValueError: an unknown field, or an aggregate or window expression (rows cannot be locked then).
    """
    if value is None:
        return queryset if queryset.ordered else queryset.order_by("pk")
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(
            f"order_by must be a list or tuple of field names or expressions, not {type(value).__name__}"
        )
    for item in value:
        if not isinstance(item, str) and not hasattr(item, "resolve_expression"):
            raise TypeError(f"order_by items must be field names or expressions, not {type(item).__name__}")
    try:
        ordered = queryset.order_by(*value)
        # Resolve the expressions as the compiler will (F() has no contains_aggregate before it is resolved).
        resolved = [
            item.resolve_expression(ordered.query.clone(), allow_joins=True, reuse=None)
            for item in value
            if not isinstance(item, str)
        ]
    except FieldError as exc:
        raise ValueError(f"order_by: {exc}") from None
    if any(item.contains_aggregate or item.contains_over_clause for item in resolved):
        raise ValueError("order_by must not use aggregates or window functions: rows cannot be locked then")
    return ordered


def assignments(model: type[Claimable], values: object, name: str, alias: str) -> dict[str, Any]:
    """Return a ``set=`` mapping checked against ``model``: local, concrete, non-key, non-claim fields.

    Each value must be storable in its column unchanged (``check_storable``); each expression must
    name fields the model has.

    Raises:
        TypeError: not a mapping, or a key that is not a field name.
        ValueError: a field that cannot be set, a value its column cannot store, an expression naming an
            unknown field or using an aggregate or window function.
    """
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise TypeError(f"{name} must be a dict of field names to values, not {type(values).__name__}")
    # A worker passes the same assignments on every call: checked once (the same values, the same result).
    same = identical(values)
    key = None if same is None else (model, alias, name, same)
    kept = None if key is None else _CHECKED.get(key)
    if kept is not None:
        return dict(kept)
    checked = _checked_assignments(model, values, name, alias)
    if key is not None:
        if len(_CHECKED) >= _MAX_CHECKED:
            _CHECKED.clear()
        # The values are kept with it: an expression's id in the key names that object while it is kept.
        _CHECKED[key] = checked
        return dict(checked)
    return checked


#: ``assignments()`` of identical assignments (``identical``), by model, alias and parameter name.
_CHECKED: dict[Hashable, dict[str, Any]] = {}
_MAX_CHECKED = 64


def _checked_assignments(
    model: type[Claimable], values: Mapping[Any, Any], name: str, alias: str
) -> dict[str, Any]:
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
        assert isinstance(field, Field)
        if isinstance(value, Model):
            value = related_key(field, value, f"{name}[{field_name!r}]")
        check_storable(field, value, f"{name}[{field_name!r}]", alias)
        if hasattr(value, "resolve_expression"):
            try:  # as the UPDATE compiler will, so an unknown field fails here rather than mid-statement
                resolved = value.resolve_expression(UpdateQuery(model), allow_joins=False, for_save=True)
            except FieldError as exc:
                raise ValueError(f"{name}[{field_name!r}]: {exc}") from None
            if getattr(resolved, "contains_aggregate", False) or getattr(
                resolved, "contains_over_clause", False
            ):
                # The UPDATE compiler would raise FieldError; an UPDATE cannot aggregate over the rows it writes.
                raise ValueError(
                    f"{name}[{field_name!r}] must not use aggregates or window functions "
                    f"({type(value).__name__}): an UPDATE writes each row from its own values; compute the "
                    "value first, or use a subquery (Subquery(...))"
                )
        checked[field.name] = value
    return checked


def queryset(target: object, name: str = "queryset") -> QuerySet[Any]:
    """Return ``target`` (a queryset, a manager or a model class) as a queryset of a ``Claimable`` model.

    Raises:
        TypeError: not a queryset, manager or model class of a ``Claimable`` model (``claimable_model``).
        ValueError: a shape whose rows cannot be claimed: sliced, ``distinct()``, combined, locked, grouped,
            with ``select_related()``, ``extra(select=...)``/``extra(tables=...)`` or ``values()``/``values_list()``, or with a window function (an annotation,
            a filter on one, an ``order_by()`` of one).
    """
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
    if query.select_related:
        # The claims lock and return rows of the model only: a join would lock the related rows too (MariaDB has
        # no FOR UPDATE OF) or clash with the claims' own column list (claim(): FieldError after its BEGIN).
        raise ValueError(
            f"{name} must not use select_related(): lockkit.claims reads and locks rows of "
            f"{target.model.__name__} only; pass the queryset without it"
        )
    if query.extra or query.extra_tables:
        # Raw SQL lockkit cannot inspect: an aggregate in a select reaches the server (PostgreSQL refuses FOR
        # UPDATE with it, after the claim's BEGIN); a table in FROM is locked too (MariaDB has no FOR UPDATE OF).
        raise ValueError(
            f"{name} must not use extra(select=/tables=): lockkit.claims reads and locks rows of "
            f"{target.model.__name__} only; filter with extra(where=...), a subquery or Exists(...) instead"
        )
    if query.values_select:
        raise ValueError(
            f"{name} must not use values() or values_list(): lockkit.claims returns Claim objects; pass the "
            "model's queryset"
        )
    if query.select_for_update:
        # Its locking clause would be compiled next to lockkit's own, and PostgreSQL applies the strongest:
        # FOR UPDATE over FOR NO KEY UPDATE, NOWAIT over SKIP LOCKED.
        raise ValueError(
            f"{name} must not carry select_for_update(): lockkit.claims locks the rows itself "
            "(FOR NO KEY UPDATE SKIP LOCKED); pass the queryset without it"
        )
    if query.group_by is not None or any(
        getattr(annotation, "contains_aggregate", False) for annotation in query.annotations.values()
    ):
        raise ValueError(
            f"{name} must not aggregate (GROUP BY): rows cannot be locked from a grouped query; "
            "filter with a subquery (pk__in=..., Exists(...)) instead"
        )
    windowed = [
        alias
        for alias, annotation in query.annotations.items()
        if getattr(annotation, "contains_over_clause", False)
    ]
    if windowed or query.where.contains_over_clause:
        named = f" (annotation {', '.join(map(repr, windowed))})" if windowed else ""
        raise ValueError(
            f"{name} must not use window functions{named}: rows cannot be locked from a query with OVER (...) "
            "(PostgreSQL refuses FOR UPDATE there); filter with a subquery (pk__in=..., Exists(...)) instead"
        )
    if any(
        getattr(item, "contains_over_clause", False) or getattr(item, "contains_aggregate", False)
        for item in query.order_by
        if not isinstance(item, str)
    ):
        raise ValueError(
            f"{name} must not be ordered by aggregates or window functions: rows cannot be locked then"
        )
    return target


def bound_alias(queryset: QuerySet[Any]) -> str | None:
    """The alias a queryset was explicitly bound to (``.using()``, ``db_manager()``), or ``None``."""
    bound: str | None = getattr(queryset, "_db", None)
    return bound


def alias_for(using: object, queryset: QuerySet[Any], hint: models.Model | None = None) -> str:
    """The alias: ``using``, else the queryset's own (``.using()``), else the router's.

    For an instance (``hint``): ``instance_alias``.

    Raises:
        AliasMismatch: ``using`` differs from the database the queryset is bound to.
    """
    if hint is not None:
        return instance_alias(using, hint)
    if using is not None:
        alias = aliases.check_alias(using)
    elif bound_alias(queryset) is not None:
        alias = str(bound_alias(queryset))
    else:
        alias = aliases.check_alias(router.db_for_write(queryset.model), "router.db_for_write(model)")
    aliases.check_queryset_alias(queryset, alias, "queryset")
    return alias


def instance_alias(using: object, instance: models.Model) -> str:
    """The alias an instance is claimed on: ``router.db_for_write(type(instance), instance=instance)``.

    The same resolution as ``Model.save()``: a router sends an instance read from a replica to the primary;
    without a router, Django answers the database the instance was read from (or ``"default"``).

    Raises:
        AliasMismatch: ``using`` names another alias (its row there would be an unrelated row with the same pk).
    """
    model = type(instance)
    routed = aliases.check_alias(
        router.db_for_write(model, instance=instance), "router.db_for_write(model, instance=target)"
    )
    if using is None:
        return routed
    alias = aliases.check_alias(using)
    if alias != routed:
        read = f"read from {instance._state.db!r}" if instance._state.db else "not read from any database"
        raise AliasMismatch(
            f"claim(target, using={alias!r}): target is a {model.__name__} {read}, whose write database is "
            f"{routed!r} (router.db_for_write(model, instance=target)); a row with pk={instance.pk!r} on "
            f"{alias!r} would be another row. Pass using={routed!r} or omit using; to claim the row on {alias!r}, "
            f"claim a queryset bound to it: {model.__name__}._base_manager.using({alias!r}).filter(pk=...)",
            alias=alias,
        )
    return routed


def claims(values: object, name: str = "claims") -> tuple[Claim, ...]:
    """Return claims of one model on one alias, each row at most once."""
    if isinstance(values, Claim):
        raise TypeError(f"{name} must be an iterable of Claim objects; for one claim use the single form")
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be an iterable of Claim objects, not {type(values).__name__}")
    result = tuple(values)
    # Compared as the field reads them: 1 and "1" are the same row of an integer primary key.
    exact = [_checked(item, f"{name} item") for item in result]
    if result:
        first = result[0]
        if any(c.model is not first.model or c.alias != first.alias for c in result):
            raise ValueError(f"{name} must all be claims of one model on one database alias")
        if len(set(exact)) != len(result):
            raise ValueError(f"{name} holds the same row more than once")
    return result


def claim(value: object, name: str = "claim") -> Claim:
    """Return ``value`` when it is a ``Claim`` whose every value is valid; nothing is sent to check it.

    A ``Claim`` is plain data that may have travelled (pickled, JSON) or been forged: the model, the alias, the
    primary key (stored unchanged by its column), the token, the worker, the attempt and the lease are checked.

    Raises:
        TypeError: not a ``Claim``; a value of the wrong type (each message names ``claim.<field>``).
        ValueError: a value out of range: an unknown alias, a pk its column would not store unchanged, a
            token outside 0..2**63-1, an empty or unstorable worker name, a negative attempt, a bad lease.
    """
    _checked(value, name)
    assert isinstance(value, Claim)
    return value


def _checked(value: object, name: str) -> Any:
    """Check ``value`` as ``claim()`` does; return its primary key as the pk field reads it."""
    if not isinstance(value, Claim):
        raise TypeError(f"{name} must be a Claim (from claim() or claim_next()), not {type(value).__name__}")
    claimable_model(value.model, f"{name}.model")
    aliases.check_alias(value.alias, f"{name}.alias")
    exact = exact_pk(value.model, value.pk, f"{name}.pk")
    token = value.token
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= _MAX_BIGINT:
        raise ValueError(f"{name}.token must be an int between 0 and {_MAX_BIGINT}, got {token!r}")
    worker(value.worker, f"{name}.worker")
    attempt = value.attempt
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        raise TypeError(f"{name}.attempt must be an int, not {type(attempt).__name__}")
    if not 0 <= attempt <= _MAX_BIGINT:
        raise ValueError(f"{name}.attempt must be between 0 and {_MAX_BIGINT}, got {attempt}")
    if value.lease is not None:
        lease(value.lease, f"{name}.lease")
    return exact


def prepared_pks(claims: Sequence[Claim], alias: str) -> list[Any]:
    """The claims' primary keys as the pk field reads them, prepared as the driver takes them on ``alias``."""
    pk_field = claims[0].model._meta.pk
    assert pk_field is not None
    connection = connections[alias]
    return [
        pk_field.get_db_prep_value(exact_pk(c.model, c.pk, "claim.pk"), connection, prepared=False)
        for c in claims
    ]


# -- whether a column stores a value unchanged (fenced primary keys, set= values) ---------------------------

# What a field's to_python() raises for values it cannot read (decimal.InvalidOperation is an ArithmeticError;
# UUIDField and others raise AttributeError for objects of the wrong kind).
_UNREADABLE = (ValidationError, TypeError, ValueError, ArithmeticError, AttributeError)


def check_text(value: str, name: str) -> str:
    """Return ``value`` when the database can store it: no NUL character, no lone surrogate.

    Raises:
        ValueError: ``value`` holds a NUL (PostgreSQL text cannot store it) or is not valid Unicode.
    """
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters (PostgreSQL text cannot store them)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} is not valid Unicode (a lone surrogate at position {exc.start})") from None
    return value


def exact_pk(model: type[Model], value: object, name: str) -> Any:
    """Return the primary key ``value`` as ``model``'s pk field reads it, if its column stores it unchanged.

    The field's ``to_python`` and validators decide (length, integer range, decimal digits and places); a
    number the field would change (``1.5`` for an integer key, ``1.001`` for two decimal places) is refused.
    ``"1"`` and ``1`` are the same integer key.

    Raises:
        TypeError: a ``bool`` or ``bytes`` key.
        ValueError: a key the field cannot read, or would store changed.
    """
    global _LAST_PK
    field = model._meta.pk
    assert field is not None
    last = _LAST_PK
    if last is not None and last[1] is value and last[0] is field:
        return last[2]
    if value is None:
        raise ValueError(f"{name} is None: a claim names a saved row")
    if isinstance(value, bool | bytes | bytearray | memoryview):
        raise TypeError(f"{name} must not be a {type(value).__name__}: it names a {model.__name__} row")
    if isinstance(value, str):
        check_text(value, name)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    try:
        python = field.to_python(value)
        field.run_validators(python)
    except _UNREADABLE as exc:
        raise ValueError(
            f"{name} {value!r} is not a valid {model.__name__} primary key: {_reason(exc)}"
        ) from None
    if isinstance(value, int | float | Decimal) and python != value:
        raise ValueError(
            f"{name} {value!r} is not a valid {model.__name__} primary key: the column would store {python!r}"
        )
    if type(value) in _KEPT_BY_IDENTITY:
        _LAST_PK = (field, value, python)
    return python


#: The last key ``exact_pk`` accepted, ``(field, value, key)``: a worker checks one claim's key several times per
#: task (before it starts, in the completion, in its judgment), each time the same immutable object.
_LAST_PK: tuple[Any, Any, Any] | None = None
_KEPT_BY_IDENTITY = frozenset({uuid.UUID, int, str})


def related_key(field: Field[Any, Any], instance: Model, name: str) -> Any:
    """The value a foreign key ``field`` stores for ``instance``, a saved row of the model it points to.

    Raises:
        TypeError: ``field`` is not a foreign key, or ``instance`` is not of the model it points to.
        ValueError: ``instance`` is unsaved.
    """
    related = field.related_model if isinstance(field, ForeignObject) else None
    if not isinstance(field, ForeignObject) or not isinstance(related, type):
        raise TypeError(
            f"{name} must not be a model instance ({type(instance).__name__}): {field.name} is not a foreign key"
        )
    if not isinstance(instance, related):
        raise TypeError(f"{name} must be a {related.__name__} instance, not a {type(instance).__name__}")
    key = getattr(instance, field.target_field.attname)
    if key is None:
        raise ValueError(f"{name} is an unsaved {related.__name__} instance: it has no row to point to")
    return key


def check_storable(field: Field[Any, Any], value: Any, name: str, alias: str) -> None:
    """Refuse a ``set=`` value the column cannot store: ``None`` for ``NOT NULL``, too long, out of range.

    Only storage limits are checked (``max_length``, the vendor's integer range, decimal digits, text the
    database cannot hold), not the field's other validators, as ``QuerySet.update()`` does not run them either.
    Expressions are left to Django; a model instance is ``related_key``'s.

    Raises:
        ValueError: the value cannot be stored unchanged (or at all).
    """
    if hasattr(value, "resolve_expression"):
        return
    if value is None:
        if not field.null:
            raise ValueError(f"{name} is None but the column is NOT NULL")
        return
    if isinstance(value, str):
        check_text(value, name)
    target: Field[Any, Any] = getattr(field, "target_field", None) or field
    try:
        python = target.to_python(value)
    except _UNREADABLE as exc:
        raise ValueError(f"{name} {value!r} cannot be stored in {field.name}: {_reason(exc)}") from None
    if python is None:
        return
    max_length = getattr(target, "max_length", None)
    if isinstance(python, str) and max_length is not None and len(python) > max_length:
        raise ValueError(f"{name} is {len(python)} characters long; the column stores at most {max_length}")
    internal = target.get_internal_type()
    if isinstance(python, int) and ("Integer" in internal or internal.endswith("AutoField")):
        low, high = connections[alias].ops.integer_field_range(internal)
        if (low is not None and python < low) or (high is not None and python > high):
            raise ValueError(f"{name} {python} is out of the column's range [{low}, {high}]")
    if isinstance(target, DecimalField) and isinstance(python, Decimal):
        _check_decimal(target, python, name)


def _check_decimal(field: DecimalField[Any, Any], value: Decimal, name: str) -> None:
    if not value.is_finite():
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    digits, places = field.max_digits, field.decimal_places
    if digits is None or places is None:
        return
    whole = value.adjusted() + 1 if value != 0 else 0  # digits before the decimal point
    if whole > digits - places:
        raise ValueError(f"{name} {value} does not fit the column's numeric({digits}, {places})")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(str(message) for message in exc.messages)
    return str(exc) or type(exc).__name__
