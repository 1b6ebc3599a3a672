"""The SQL of claims on PostgreSQL, built from Django's own compilers with every value passed as a parameter.

https://www.postgresql.org/docs/current/sql-select.html#SQL-FOR-UPDATE-SHARE and
https://www.postgresql.org/docs/current/queries-with.html#QUERIES-WITH-MODIFYING
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import DateTimeField, DurationField, F, Field, Func, QuerySet, Value
from django.db.models.expressions import BaseExpression
from django.db.models.sql import UpdateQuery
from django.db.models.sql.datastructures import BaseTable

from lockkit.claims.mixin import Claimable
from lockkit.translate import translating


class StatementTimestamp(Func):
    """``statement_timestamp()``: the database clock at the start of the current statement.

    Not ``now()``, which is frozen at the start of the transaction, so a lease written late in a long
    transaction (``claim()`` after waiting for the row lock, a ``heartbeat()`` inside the caller's
    ``atomic()``) would be shortened by the transaction's age. Not ``clock_timestamp()``, which is volatile:
    it changes from row to row of one statement and cannot be an index condition, so ``lease_expires_at <
    clock_timestamp()`` could not use the ``lease_expires_at`` index. ``statement_timestamp()`` is stable: one
    value per statement.
    https://www.postgresql.org/docs/current/functions-datetime.html#FUNCTIONS-DATETIME-CURRENT
    """

    template = "statement_timestamp()"
    output_field = DateTimeField()


def lease_end(lease: float) -> BaseExpression:
    """``statement_timestamp() + <lease seconds>`` (the interval travels as a parameter)."""
    return StatementTimestamp() + Value(timedelta(seconds=lease), output_field=DurationField())


def claim_assignments(worker: str, lease: float, extra: dict[str, Any]) -> dict[str, Any]:
    """What every claim writes: worker, next token, lease, one more attempt, and the caller's fields."""
    return {
        "claimed_by": worker,
        "claim_token": F("claim_token") + 1,
        "claimed_at": StatementTimestamp(),
        "lease_expires_at": lease_end(lease),
        "attempts": F("attempts") + 1,
        **extra,
    }


def update_prefix(model: type[Claimable], alias: str, values: dict[str, Any]) -> tuple[str, list[Any]]:
    """Compile ``UPDATE <table> SET <assignments>`` (no ``WHERE``) with Django's update compiler.

    Django prepares each value for its field (``get_db_prep_save``) and compiles expressions (``F``, ``Case``,
    functions); a field name it does not know raises ``FieldError`` here, before anything runs.
    """
    query = UpdateQuery(model)
    query.add_update_values(values)
    sql, params = query.get_compiler(alias).as_sql()
    if " WHERE " in sql or getattr(query, "related_updates", None):  # pragma: no cover - parents refused
        raise AssertionError(f"unexpected UPDATE shape: {sql}")
    return sql, list(params)


def locking_select(
    queryset: QuerySet[Any], alias: str, *, limit: int | None, skip_locked: bool
) -> tuple[str, list[Any]] | None:
    """Compile ``SELECT <pk> FROM ... WHERE <queryset's filters> [ORDER BY ... LIMIT n] FOR NO KEY UPDATE OF
    <table>``.

    The filters come from Django's compiler (values as parameters). The locking clause is appended here,
    locking only the queried model's rows; ``FOR NO KEY UPDATE`` lets other sessions insert rows that
    reference the job.
    """
    selection = queryset.values_list("pk")
    if limit is not None:
        selection = selection[:limit]
    compiler = selection.query.get_compiler(alias)
    try:
        sql, params = compiler.as_sql()
    except EmptyResultSet:  # .none(), pk__in=[]: no row can match, so there is nothing to run
        return None
    connection = connections[alias]
    base = next(iter(compiler.query.alias_map))
    if not isinstance(compiler.query.alias_map[base], BaseTable):  # pragma: no cover - Django invariant
        raise AssertionError(f"cannot find the base table of {sql}")
    locking = connection.ops.for_update_sql(
        skip_locked=skip_locked, of=(connection.ops.quote_name(base),), no_key=True
    )
    return f"{sql} {locking}", list(params)


def column(model: type[Claimable], alias: str, name: str) -> str:
    """The qualified, quoted column of a field: ``"table"."column"``."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field)
    assert field.column is not None
    qn = connections[alias].ops.quote_name
    return f"{qn(model._meta.db_table)}.{qn(field.column)}"


def pk_column(model: type[Claimable], alias: str) -> str:
    """The qualified, quoted primary-key column."""
    pk = model._meta.pk
    assert pk is not None
    return column(model, alias, pk.name)


def prepare_pks(model: type[Claimable], alias: str, pks: Sequence[Any]) -> tuple[list[Any], str]:
    """Primary keys as the driver takes them, and the SQL type of an array of them."""
    pk = model._meta.pk
    assert pk is not None
    connection = connections[alias]
    values = [pk.get_db_prep_value(value, connection, prepared=False) for value in pks]
    return values, f"{pk.cast_db_type(connection)}[]"


def run(alias: str, sql: str, params: Sequence[Any]) -> tuple[list[tuple[Any, ...]], int]:
    """Execute one statement on ``alias``; return its rows and row count."""
    with translating(alias, nowait=False), connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall() if cursor.description is not None else []
        return [tuple(row) for row in rows], cursor.rowcount
