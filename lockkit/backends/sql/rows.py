"""Model instances from rows of a statement lockkit compiled, read as Django reads its own results."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db import connections, models

M = TypeVar("M", bound=models.Model)


def instances(model: type[M], alias: str, rows: Sequence[Sequence[Any]]) -> list[M]:
    """Model instances from rows of the concrete columns, through the fields' own converters (as Django reads)."""
    connection = connections[alias]
    fields = model._meta.concrete_fields
    converters: list[list[tuple[Callable[..., Any], Any]]] = []
    for field in fields:
        column = field.get_col(model._meta.db_table)
        found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
        converters.append([(converter, column) for converter in found])
    names = [field.attname for field in fields]
    made = []
    for row in rows:
        values = []
        for value, steps in zip(row, converters, strict=True):
            for converter, column in steps:
                value = converter(value, column, connection)
            values.append(value)
        made.append(model.from_db(alias, names, values))
    return made
