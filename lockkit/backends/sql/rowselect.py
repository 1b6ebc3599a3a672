"""One row's locking ``SELECT ... WHERE <pk> = %s FOR UPDATE``, compiled once per model, alias and lock options.

``scope.get(Model, pk=value)`` builds a queryset, compiles it and turns the reply into an instance on every call;
only the value changes. For the plain case (the model's default manager is Django's own ``Manager``, one table, a
single-column primary key, no field that converts values read from the database) the statement Django compiled
the first time is kept with the position of its one parameter, and later calls prepare the value as Django's exact
lookup does (``get_prep_value``, then ``get_db_prep_value``) and build the instance with ``Model.from_db``, as
Django's iterator does. Anything else is ``None``: the caller runs the queryset. The value stays a parameter. See
https://docs.djangoproject.com/en/stable/ref/models/instances/#customizing-model-loading.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from django.db import connections, models

_MAX_PLANS = 512
_PLAIN = (int, str, uuid.UUID)


@dataclass(frozen=True)
class Select:
    """A compiled locking ``SELECT`` of one row by primary key.

    Attributes:
        sql: The statement, with one ``%s`` for the primary key.
        attnames: The selected columns' attribute names, in order (``Model.from_db``'s ``field_names``).
    """

    sql: str
    attnames: tuple[str, ...]


_selects: dict[Hashable, Select | None] = {}
_lock = threading.Lock()


def eligible(model: type[models.Model], lookups: Mapping[str, Any]) -> Any:
    """The primary-key value of ``scope.get(model, **lookups)`` when it can run compiled, else ``None``."""
    if len(lookups) != 1 or type(model._default_manager) is not models.Manager:
        return None
    meta = model._meta
    pk = meta.pk
    if pk is None or isinstance(pk, models.CompositePrimaryKey) or (meta.parents and not meta.proxy):
        return None
    ((name, value),) = lookups.items()
    if name not in ("pk", pk.name, pk.attname) or type(value) not in _PLAIN:
        return None
    return value


def prepared(model: type[models.Model], alias: str, value: Any) -> Any:
    """``value`` prepared as Django's exact lookup on the primary key prepares it.

    Raises:
        ValueError, TypeError: as Django's ``get_prep_value`` (``Field 'id' expected a number...``).
    """
    pk = model._meta.pk
    assert pk is not None
    return pk.get_db_prep_value(pk.get_prep_value(value), connections[alias], prepared=True)


def select_for(key: Hashable) -> Select | Literal[False] | None:
    """The compiled statement under ``key``; ``False`` when none was compiled yet."""
    return _selects.get(key, False)


def keep(
    key: Hashable, model: type[models.Model], sql: str, params: Any, value: Any, compiler: Any
) -> Select | None:
    """Keep ``sql`` (``compiler``'s compilation of the first call) under ``key`` if it is the plain statement.

    Plain: its only parameter is ``value``, it selects the model's concrete fields in order, and no field converts
    what it reads (``compiler.get_converters``, as Django's iterator applies them). Otherwise ``None`` is kept:
    that call shape always runs through Django.

    Returns:
        What is kept.
    """
    fields = list(model._meta.concrete_fields)
    columns = [expression for expression, _, _ in compiler.select]
    plain = (
        len(params) == 1
        and params[0] == value
        and type(params[0]) is type(value)
        and [getattr(column, "target", None) for column in columns] == fields
        and not compiler.get_converters(columns)
    )
    found = Select(sql=sql, attnames=tuple(f.attname for f in fields)) if plain else None
    with _lock:
        if len(_selects) >= _MAX_PLANS:
            _selects.clear()
        _selects[key] = found
    return found
