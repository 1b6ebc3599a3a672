"""Model instances built from the columns a claiming statement returned (``claim_next(..., fetch=True)``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.models import Field

from lockkit.claims.mixin import Claimable
from lockkit.claims.sql import Row, fetched_column


def instances(
    model: type[Claimable], alias: str, fields: Sequence[Field[Any, Any]], rows: Sequence[Row]
) -> list[Claimable]:
    """Build one instance per row, converting each value as a queryset would (``from_db_value``, backend).

    The converters are those Django's compiler applies to a column (``connection.ops.get_db_converters`` and
    the field's own), then ``Model.from_db`` builds the instance, so it is as if loaded by a ``QuerySet``
    (``_state.db`` is ``alias``, ``_state.adding`` is ``False``). See
    https://docs.djangoproject.com/en/stable/ref/models/instances/#customizing-model-loading.
    """
    connection = connections[alias]
    table = model._meta.db_table
    converters = []
    for field in fields:
        column = field.get_col(table)
        converters.append(
            (column, [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)])
        )
    names = [field.attname for field in fields]
    built: list[Claimable] = []
    for row in rows:
        values = []
        for index, (column, functions) in enumerate(converters):
            value = row[fetched_column(index)]
            for convert in functions:
                value = convert(value, column, connection)
            values.append(value)
        built.append(model.from_db(alias, names, values))
    return built
