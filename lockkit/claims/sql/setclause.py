"""``UPDATE <table> SET <assignments>`` compiled once per shape of the assignments, with fresh parameters per call.

Django's update compiler costs a claim about as much as a round trip, yet what it produces depends only on the
model, the alias and the shape of the assignments: which fields, and for each whether the value is a plain value
(one parameter), ``None`` (``NULL``), one of lockkit's own constant expressions (``claim_token + 1``, the database
clock) or a lease end (the clock plus an interval parameter), or the shape of an expression (``exprshape``: its
structure, with each ``Value`` of a plain type standing for its type). A shape is compiled by Django the first time,
together with a recipe that re-makes the parameters from the values (``field.get_db_prep_save`` for a plain value,
as Django does; for an expression, each parameter is either one of its ``Value`` leaves, prepared as ``Value``
prepares itself, or a constant of the shape); the recipe is checked against Django's own parameters before it is
kept. Any other value (a model instance, a list, an expression holding a queryset) is compiled by Django on every
call, as before. Every value stays a parameter. ``compilations()`` counts Django's compilations, for tests. See
https://docs.djangoproject.com/en/stable/ref/models/fields/#django.db.models.Field.get_db_prep_save.
"""

from __future__ import annotations

import enum
import threading
import uuid
from collections.abc import Callable, Hashable, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist
from django.db import connections
from django.db.models import Field, JSONField
from django.db.models.expressions import BaseExpression
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from lockkit.claims.sql import exprshape

#: Plain values whose field preparation yields one parameter (anything else is compiled by Django per call).
_PLAIN = frozenset({str, int, float, bool, Decimal, datetime, date, time, timedelta, uuid.UUID, bytes})
_MAX_SHAPES = 256
#: Documents a ``JSONField`` adapts into one parameter.
_DOCUMENTS = frozenset({dict, list})

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
        shape: list[tuple[str, Hashable]] = []
        expressions = False
        kind: Hashable
        for name, value in values.items():
            if value is None:
                kind = "null"
            elif type(value) in _PLAIN or (isinstance(value, enum.Enum) and type(value.value) in _PLAIN):
                kind = "value"  # a member of a Django ``TextChoices``/``IntegerChoices`` too: prepared by its field
            elif type(value) in _DOCUMENTS and _is_json(model, name):
                kind = "json"  # one parameter, the document adapted by the field
            elif id(value) in self._constants:
                kind = self._constants[id(value)]
            elif self._is_lease_end(value):
                kind = "lease end"
            else:
                form = exprshape.shape(value)
                if form is None:
                    return None
                kind, expressions = form, True
            shape.append((name, kind))
        if expressions:  # what an expression compiles to may depend on the time zone (Trunc, Extract)
            return (model, alias, tuple(shape), settings.USE_TZ, timezone.get_current_timezone_name())
        return (model, alias, tuple(shape))

    def _learn(self, key: Hashable, model: type[Any], alias: str, values: dict[str, Any]) -> Compiled:
        sql, params = _django(model, alias, values)
        connection = connections[alias]
        steps: list[_Step] = []
        for name, value in values.items():
            kind = self._constants.get(id(value)) or ("lease end" if self._is_lease_end(value) else None)
            if kind is None and hasattr(value, "resolve_expression") and value is not None:
                steps.append(_expression_step(model, alias, name, value))
            else:
                steps.append(_step(model, alias, name, value, kind))
        recipe = tuple(steps)
        if any(step is _give_up for step in recipe):
            return sql, params  # not learnable from this call (equal values): a later call may teach it
        # Kept only when the recipe gives exactly Django's parameters for this call.
        made = _params(recipe, values, connection)
        same = made is not None and len(made) == len(params) and all(map(_same, made, params))
        entry = (sql, recipe) if same else None
        with self._lock:
            if len(self._shapes) >= _MAX_SHAPES:
                self._shapes.clear()
            self._shapes[key] = entry
        return sql, params


_MISSING: Any = object()


_COMPILED = [0]


def compilations() -> int:
    """How many ``UPDATE ... SET`` statements Django has compiled for lockkit's claims (a seam for tests)."""
    return _COMPILED[0]


def _django(model: type[Any], alias: str, values: dict[str, Any]) -> Compiled:
    _COMPILED[0] += 1
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


def _expression_step(model: type[Any], alias: str, name: str, value: Any) -> _Step:
    """The recipe step of an expression: its parameters from its ``Value`` leaves and the shape's constants.

    Learnt from two compilations by Django, of the value and of a copy whose leaves hold other values
    (``exprshape.probe``): a parameter that changed is the leaf whose prepared value it is, one that did not is a
    constant of the shape. Any doubt (a different SQL text, a parameter two leaves could be) gives up.
    """
    sql, params = _django(model, alias, {name: value})
    probed = exprshape.probe(value)
    if probed is None:
        return _give_up
    copy, copy_leaves = probed
    probe_sql, probe_params = _django(model, alias, {name: copy})
    connection = connections[alias]
    top = exprshape.leaves(value)
    if probe_sql != sql or len(probe_params) != len(params) or top is None:
        return _give_up
    mine = [exprshape.prepared(leaf, leaf is value, connection) for leaf in top]
    theirs = [exprshape.prepared(leaf, leaf is copy, connection) for leaf in copy_leaves]
    if any(item is None for item in (*mine, *theirs)):
        return _give_up
    slots: list[tuple[bool, Any]] = []  # (is a leaf, leaf index or the constant)
    for original, changed in zip(params, probe_params, strict=True):
        if type(original) is type(changed) and original == changed:
            slots.append((False, original))
            continue
        matches = [
            index
            for index, (a, b) in enumerate(zip(mine, theirs, strict=True))
            if a == [original] and b == [changed]
        ]
        if len(matches) != 1:
            return _give_up
        slots.append((True, matches[0]))

    def step(value: Any, connection: Any) -> list[Any] | None:
        found = exprshape.leaves(value)
        if found is None:
            return None
        made: list[Any] = []
        for is_leaf, what in slots:
            if not is_leaf:
                made.append(what)
                continue
            leaf = found[what]
            produced = exprshape.prepared(leaf, leaf is value, connection)
            if produced is None or len(produced) != 1:
                return None
            made += produced
        return made

    return step


def _prepared(field: Field[Any, Any], value: Any, connection: Any) -> list[Any] | None:
    prepared = field.get_db_prep_save(value, connection=connection)
    # Django writes NULL (no parameter) for a value its field prepares to None, and compiles one with as_sql.
    if prepared is None or hasattr(prepared, "as_sql"):
        return None
    return [prepared]


def _is_json(model: type[Any], name: str) -> bool:
    try:
        return isinstance(model._meta.get_field(name), JSONField)
    except FieldDoesNotExist:
        return False


def _same(made: Any, django: Any) -> bool:
    """Whether a recipe's parameter is the one Django made: equal, or the same adapter of equal documents.

    psycopg's JSON wrappers (``Jsonb(obj)``, what ``JSONField`` prepares on PostgreSQL) compare by identity; their
    ``obj`` says what they send.
    """
    if type(made) is not type(django):
        return False
    if made == django:
        return True
    marker = object()
    document = getattr(made, "obj", marker)
    return document is not marker and document == getattr(django, "obj", marker)


def _params(steps: tuple[_Step, ...], values: dict[str, Any], connection: Any) -> list[Any] | None:
    params: list[Any] = []
    for step, value in zip(steps, values.values(), strict=True):
        produced = step(value, connection)
        if produced is None:
            return None
        params += produced
    return params
