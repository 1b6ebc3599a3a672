"""Whether a column stores a value unchanged: checked before SQL for fenced primary keys and ``set=`` values.

A fence compares primary keys; a key the column would truncate, round or reject names another row or fails in
the database after the statement was sent. Both are refused here with a ``ValueError``/``TypeError`` naming the
parameter. https://www.postgresql.org/docs/current/datatype.html
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connections
from django.db.models import DecimalField, Field, Model

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
    field = model._meta.pk
    assert field is not None
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
    return python


def check_storable(field: Field[Any, Any], value: Any, name: str, alias: str) -> None:
    """Refuse a ``set=`` value the column cannot store: ``None`` for ``NOT NULL``, too long, out of range.

    Only storage limits are checked (``max_length``, the vendor's integer range, decimal digits, text the
    database cannot hold), not the field's other validators, as ``QuerySet.update()`` does not run them either.
    Expressions and model instances are left to Django.

    Raises:
        ValueError: the value cannot be stored unchanged (or at all).
    """
    if hasattr(value, "resolve_expression") or isinstance(value, Model):
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
