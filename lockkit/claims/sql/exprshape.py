"""The shape of a ``set=`` expression: what its compiled SQL depends on, with its ``Value`` leaves set apart.

Two expressions of one shape compile to the same SQL text and differ only in the parameters their leaves give: the
shape is the expression's structure as ``deconstruct()`` reports it (its class and constructor arguments, as Django
compares expressions), each ``Value`` of a plain type standing for its type and explicit output field. Anything
whose compilation could depend on more than that (a queryset, a model instance, an object of unknown kind) has no
shape, and is compiled by Django per call. See
https://docs.djangoproject.com/en/stable/ref/models/expressions/#value-expressions.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Hashable
from datetime import date, datetime, time, timedelta, tzinfo
from decimal import Decimal
from typing import Any

from django.core.exceptions import FieldError
from django.db.models import Field, Q, Value
from django.db.models.expressions import BaseExpression, Combinable
from django.utils.hashable import make_hashable

#: Leaf values whose ``Value`` compiles to one parameter of the same SQL text whatever the value.
_LEAF = (str, int, float, Decimal, datetime, date, time, timedelta, uuid.UUID, bytes)
#: Constants that may sit in a shape as themselves (their value is part of the shape).
_CONSTANT = (str, int, float, Decimal, datetime, date, time, timedelta, uuid.UUID, bytes, tzinfo)


class _Unshaped(Exception):
    """The value has no shape (see the module docstring)."""


def shape(value: object) -> Hashable | None:
    """The shape of the expression ``value``, or ``None`` when it has none (or is not an expression)."""
    if not _is_expression(value):
        return None
    try:
        return _walk(value, [])
    except (_Unshaped, TypeError):  # TypeError: an unhashable constructor argument
        return None


def leaves(value: object) -> list[Value] | None:
    """The ``Value`` leaves of ``value``, in the order its shape lists them; ``None`` when it has no shape."""
    found: list[Value] = []
    try:
        _walk(value, found)
    except (_Unshaped, TypeError):
        return None
    return found


def probe(value: object) -> tuple[Any, list[Value]] | None:
    """A copy of ``value`` whose leaves hold other values of the same types, and those leaves in order.

    ``None`` when the copy cannot be made or its leaves cannot be told apart from the original's.
    """
    original = leaves(value)
    if original is None:
        return None
    memo: dict[int, Any] = {}
    try:
        duplicate = copy.deepcopy(value, memo)
    except Exception:
        return None
    copies: list[Value] = []
    for index, leaf in enumerate(original):
        twin = memo.get(id(leaf))
        if not isinstance(twin, Value):
            return None
        other = _other(leaf.value, index)
        if other is _NONE:
            return None
        twin.value = other  # a public attribute of our own copy, never of the caller's expression
        copies.append(twin)
    if leaves(duplicate) != copies:
        return None
    return duplicate, copies


def prepared(leaf: Value, for_save: bool, connection: Any) -> list[Any] | None:
    """The parameters ``leaf`` compiles to on ``connection``, as ``Value.as_sql`` makes them.

    ``None`` when its SQL is not one placeholder (a field with ``get_placeholder``).
    """
    try:
        field = leaf.output_field
    except FieldError:  # no type to prepare for: the value goes as it is
        field = None
    value = leaf.value
    if field is not None:
        if for_save:
            value = field.get_db_prep_save(value, connection=connection)
        else:
            value = field.get_db_prep_value(value, connection=connection)
        if hasattr(field, "get_placeholder"):
            return None
    return [] if value is None else [value]


def _is_expression(value: object) -> bool:
    return isinstance(value, BaseExpression | Combinable) and hasattr(value, "deconstruct")


def _walk(item: object, found: list[Value]) -> Hashable:
    if type(item) is Value:
        value = item.value
        _, _, kwargs = item.deconstruct()
        field = kwargs.get("output_field")
        if not isinstance(value, _LEAF) or isinstance(value, bool):  # None, True: part of the shape itself
            return ("constant value", type(value), _walk(value, found), _field(field))
        found.append(item)
        return ("value", type(value), _field(field))
    if _is_expression(item) or isinstance(item, Q):
        _, args, kwargs = item.deconstruct()  # type: ignore[attr-defined]
        return (
            type(item),
            tuple(_walk(arg, found) for arg in args),
            tuple(sorted((name, _walk(arg, found)) for name, arg in kwargs.items())),
        )
    if isinstance(item, Field):
        return _field(item)
    if item is None or isinstance(item, bool):
        return ("constant", type(item), item)
    if isinstance(item, _CONSTANT):
        hash(item)
        return ("constant", type(item), item)
    if isinstance(item, list | tuple):
        return (type(item), tuple(_walk(element, found) for element in item))
    if isinstance(item, dict):
        return (dict, tuple(sorted((str(key), _walk(element, found)) for key, element in item.items())))
    raise _Unshaped(type(item).__name__)


def _field(field: object) -> Hashable:
    if field is None:
        return None
    if not isinstance(field, Field):
        raise _Unshaped(type(field).__name__)
    _, path, args, kwargs = field.deconstruct()
    made: Hashable = ("field", path, make_hashable(args), make_hashable(kwargs))
    hash(made)
    return made


_NONE: Any = object()


def _other(value: Any, index: int) -> Any:
    """A value of ``value``'s type that differs from it and from the other leaves' (by ``index``)."""
    step = index + 1
    try:
        if isinstance(value, str):
            return f"{value}\x1elockkit-probe-{step}"
        if isinstance(value, int):
            return value + 1_000_003 * step if value < 2**62 else value - 1_000_003 * step
        if isinstance(value, float):
            return value + 0.5 * step + 0.25
        if isinstance(value, Decimal):
            return value + step
        if isinstance(value, datetime):
            return value + timedelta(days=step, microseconds=step)
        if isinstance(value, date):
            return value + timedelta(days=step)
        if isinstance(value, time):
            moment = datetime.combine(date(2000, 1, 1), value) + timedelta(seconds=step, microseconds=step)
            return moment.timetz() if value.tzinfo is not None else moment.time()
        if isinstance(value, timedelta):
            return value + timedelta(seconds=step, microseconds=step)
        if isinstance(value, uuid.UUID):
            return uuid.UUID(int=(value.int + step) % 2**128)
        if isinstance(value, bytes):
            return value + bytes([step % 256, 0x1E])
    except (OverflowError, ValueError):
        return _NONE
    return _NONE
