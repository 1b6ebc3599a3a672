"""Model instances from rows of a statement lockkit compiled, read as Django reads its own results."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

from django.conf import settings
from django.db import connections, models

M = TypeVar("M", bound=models.Model)

#: The converters and attribute names, per connection (its own ``ops``) and (model, fields, USE_TZ): the same for
#: every row a statement of that shape returns, so they are looked up once per connection. A converter that is a
#: method of the connection's ``ops`` is kept as its function and called with the ``ops`` of the moment: a bound
#: method would hold the connection (``ops.connection``) and keep the weak key, and its session, alive for good.
_CONVERTERS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[list[Any], list[str], Sequence[Any]]]]
_CONVERTERS = weakref.WeakKeyDictionary()


def instances(
    model: type[M],
    alias: str,
    rows: Sequence[Any],
    fields: Sequence[models.Field[Any, Any]] | None = None,
    keys: Sequence[Any] | None = None,
) -> list[M]:
    """Build one instance per row, converting each value as a queryset would (``from_db_value``, backend).

    The converters are those Django's compiler applies to a column (``connection.ops.get_db_converters`` and the
    field's own), then ``Model.from_db`` builds the instance, so it is as if loaded by a ``QuerySet``
    (``_state.db`` is ``alias``, ``_state.adding`` is ``False``). See
    https://docs.djangoproject.com/en/stable/ref/models/instances/#customizing-model-loading.

    Args:
        model: The model class.
        alias: The database alias the rows were read from.
        rows: One row per instance: values in the order of ``fields``, or indexed by ``keys``.
        fields: The fields the rows carry; default the model's concrete fields.
        keys: Where each field's value is in a row (a column name of a row read as a dict); default its position.
    """
    connection = connections[alias]
    chosen = model._meta.concrete_fields if fields is None else fields
    # The model's own field list is known by its identity (hashing each field, per call, cost a worker a few
    # percent of a task); a field added at run time makes Django build a new list, and the converters anew.
    own = chosen is model._meta.concrete_fields
    # USE_TZ too: MySQL's converters of date-times are chosen by it when they are listed (``override_settings``).
    key = (model, None if own else tuple(chosen), settings.USE_TZ)
    per_connection = _CONVERTERS.get(connection)
    if per_connection is None:
        per_connection = _CONVERTERS.setdefault(connection, {})
    kept = per_connection.get(key)
    if kept is None or (own and kept[2] is not chosen):
        kept = per_connection[key] = (*_converters(connection, model, chosen), chosen)
    converters, names, _ = kept
    where = range(len(chosen)) if keys is None else keys
    ops = connection.ops
    built: list[M] = []
    for row in rows:
        values = []
        for index, (column, functions) in zip(where, converters, strict=True):
            value = row[index]
            for convert, of_ops in functions:
                value = (
                    convert(ops, value, column, connection) if of_ops else convert(value, column, connection)
                )
            values.append(value)
        built.append(model.from_db(alias, names, values))
    return built


def _converters(
    connection: Any, model: type[models.Model], fields: Sequence[models.Field[Any, Any]]
) -> tuple[list[Any], list[str]]:
    """Each field's column and converters (as a queryset's, each with whether it is an ``ops`` method); the names."""
    table = model._meta.db_table
    ops = connection.ops
    converters = []
    for field in fields:
        column = field.get_col(table)
        functions = [
            (convert.__func__, True) if getattr(convert, "__self__", None) is ops else (convert, False)
            for convert in [*ops.get_db_converters(column), *column.get_db_converters(connection)]
        ]
        converters.append((column, functions))
    return converters, [field.attname for field in fields]
