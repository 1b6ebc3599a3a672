"""``UPDATE <table> SET <assignments>`` compiled once per shape of the assignments, with fresh parameters per call.

Django's update compiler costs a claim about as much as a round trip, yet what it produces depends only on the
model, the alias and the shape of the assignments: which fields, and for each whether the value is a plain value
(one parameter), ``None`` (``NULL``), one of lockkit's own constant expressions (``claim_token + 1``, the database
clock) or a lease end (the clock plus an interval parameter). A shape is compiled by Django the first time, together
with a recipe that re-makes the parameters from the values (``field.get_db_prep_save`` for a plain value, as Django
does); the recipe is checked against Django's own parameters before it is kept. Any other value (a caller's
expression, a model instance, a list) is compiled by Django on every call, as before. Every value stays a
parameter. See https://docs.djangoproject.com/en/stable/ref/models/fields/#django.db.models.Field.get_db_prep_save.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Hashable, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db import connections
from django.db.models import Field
from django.db.models.expressions import BaseExpression
from django.db.models.sql import UpdateQuery

#: Plain values whose field preparation yields one parameter (anything else is compiled by Django per call).
_PLAIN = frozenset({str, int, float, bool, Decimal, datetime, date, time, timedelta, uuid.UUID, bytes})
_MAX_SHAPES = 256

Compiled = tuple[str, list[Any]]
# One recipe step per assignment: the values' parameters it contributes (may be none), or None to give up.
_Step = Callable[[Any, Any], list[Any] | None]


class SetClauses:
    """A cache of compiled ``UPDATE ... SET`` statements (no ``WHERE``) keyed by model, alias and shape.

    ``constants`` are lockkit's own expression objects (reused, never rebuilt per call), recognised by identity;
    ``is_lease_end`` recognises a lease end, ``clock + Value(timedelta)``, whose interval is its one parameter.
    """

    def __init__(
        self, constants: Mapping[str, BaseExpression], is_lease_end: Callable[[object], bool]
    ) -> None:
        """Recognise ``constants`` (by identity) and lease ends (by ``is_lease_end``) in assignments."""
        self._constants = {id(expression): name for name, expression in constants.items()}
        self._keep = list(constants.values())  # the ids above stay valid while these live
        self._is_lease_end = is_lease_end
        self._shapes: dict[Hashable, tuple[str, tuple[_Step, ...]] | None] = {}
        self._lock = threading.Lock()

    def compile(self, model: type[Any], alias: str, values: dict[str, Any]) -> Compiled:
        """Return ``UPDATE <table> SET ...`` for ``values`` and its parameters.

        Raises:
            django.core.exceptions.FieldError: a field name Django does not know (on the first call of a shape).
        """
        key = self._key(model, alias, values)
        if key is None:
            return _django(model, alias, values)
        entry = self._shapes.get(key, _MISSING)
        if entry is _MISSING:
            return self._learn(key, model, alias, values)
        if entry is not None:
            sql, steps = entry
            params = _params(steps, values, connections[alias])
            if params is not None:
                return sql, params
        return _django(model, alias, values)

    def _key(self, model: type[Any], alias: str, values: dict[str, Any]) -> Hashable | None:
        shape: list[tuple[str, str]] = []
        for name, value in values.items():
            if value is None:
                kind = "null"
            elif type(value) in _PLAIN:
                kind = "value"
            elif id(value) in self._constants:
                kind = self._constants[id(value)]
            elif self._is_lease_end(value):
                kind = "lease end"
            else:
                return None
            shape.append((name, kind))
        return (model, alias, tuple(shape))

    def _learn(self, key: Hashable, model: type[Any], alias: str, values: dict[str, Any]) -> Compiled:
        sql, params = _django(model, alias, values)
        connection = connections[alias]
        steps: list[_Step] = []
        for name, value in values.items():
            kind = self._constants.get(id(value)) or ("lease end" if self._is_lease_end(value) else None)
            steps.append(_step(model, alias, name, value, kind))
        recipe = tuple(steps)
        # Kept only when the recipe gives exactly Django's parameters for this call.
        entry = (sql, recipe) if _params(recipe, values, connection) == params else None
        with self._lock:
            if len(self._shapes) >= _MAX_SHAPES:
                self._shapes.clear()
            self._shapes[key] = entry
        return sql, params


_MISSING: Any = object()


def _django(model: type[Any], alias: str, values: dict[str, Any]) -> Compiled:
    query = UpdateQuery(model)
    query.add_update_values(values)
    sql, params = query.get_compiler(alias).as_sql()
    # The statement's own WHERE (a subquery in a value may have one of its own, which is fine).
    if query.where or getattr(query, "related_updates", None):  # pragma: no cover - parents refused
        raise AssertionError(f"unexpected UPDATE shape: {sql}")
    return sql, list(params)


def _step(model: type[Any], alias: str, name: str, value: Any, kind: str | None) -> _Step:
    field = model._meta.get_field(name)
    if value is None:
        # Django 5.2 writes NULL in the SQL text; Django 6 sends None as a parameter: learn which from Django.
        null_params = _django(model, alias, {name: None})[1]
        return lambda _value, _connection: list(null_params)
    if kind == "lease end":  # the clock plus the interval: one parameter, the interval
        duration = value.rhs.output_field
        return lambda value, connection: [duration.get_db_prep_save(value.rhs.value, connection=connection)]
    if kind is not None:  # one of lockkit's constant expressions: the same parameters every time
        fixed = _django(model, alias, {name: value})[1]
        return lambda _value, _connection: list(fixed)
    if not isinstance(field, Field) or hasattr(field, "get_placeholder"):
        return _give_up
    return lambda value, connection: _prepared(field, value, connection)


def _give_up(_value: Any, _connection: Any) -> None:
    return None


def _prepared(field: Field[Any, Any], value: Any, connection: Any) -> list[Any] | None:
    prepared = field.get_db_prep_save(value, connection=connection)
    # Django writes NULL (no parameter) for a value its field prepares to None, and compiles one with as_sql.
    if prepared is None or hasattr(prepared, "as_sql"):
        return None
    return [prepared]


def _params(steps: tuple[_Step, ...], values: dict[str, Any], connection: Any) -> list[Any] | None:
    params: list[Any] = []
    for step, value in zip(steps, values.values(), strict=True):
        produced = step(value, connection)
        if produced is None:
            return None
        params += produced
    return params
