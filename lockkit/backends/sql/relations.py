"""Naming a queryset's table by an unqualified alias, so ``FOR UPDATE OF`` can lock a schema-qualified table.

PostgreSQL's locking clause takes only unqualified names ("FOR UPDATE must specify unqualified relation
names"), so ``db_table = 'schema"."table'`` (Django's idiom for another schema) cannot be named there; an alias
can. https://www.postgresql.org/docs/current/sql-select.html#SQL-FOR-UPDATE-SHARE
"""

from __future__ import annotations

import contextlib
from typing import Any

import django
from django.db import connections
from django.db.models import Model
from django.db.models.sql import Query
from django.db.models.sql.compiler import SQLCompiler

#: The alias a schema-qualified base table is given.
BASE_ALIAS = "lockkit_row"


def is_qualified(model: type[Model], alias: str) -> bool:
    """Whether ``model``'s table is named with a qualifier (``schema.table``) on the database ``alias``."""
    quote = connections[alias].ops.quote_name
    mark = quote("x")[0]  # the vendor's identifier quote: " on PostgreSQL, ` on MySQL
    return f"{mark}.{mark}" in quote(model._meta.db_table)


def alias_base_table(query: Query, name: str = BASE_ALIAS) -> str:
    """Rename ``query``'s base table to ``name`` (every other table too, keeping their order); return ``name``.

    The query compiles as ``FROM "schema"."table" name``, with every column qualified by ``name``. Tables keep
    their order in the ``FROM`` clause (the base table first), and later filters and orderings resolve against
    the new alias.
    """
    base = query.get_initial_alias()
    assert base is not None
    renames: dict[Any, Any] = {
        alias: name if alias == base else f"{name}_{n}" for n, alias in enumerate(query.alias_map)
    }
    query.change_aliases(renames)
    # Query.base_table is a cached_property holding the first alias, the old name now: its cached value is
    # cleared by deleting the attribute, as Django documents for cached_property (absent if never read).
    with contextlib.suppress(AttributeError):
        del query.base_table
    return name


def quote_as_from_clause(compiler: SQLCompiler, name: str) -> str:
    """``name`` (the base table or its alias) quoted as the compiler wrote it in the ``FROM`` clause.

    Django 6.1 quotes every name (``SQLCompiler.quote_name``) and deprecates ``quote_name_unless_alias``; before it,
    ``quote_name_unless_alias`` is what the ``FROM`` clause used (an alias of Django's own, such as ``U0``, unquoted).
    """
    if django.VERSION >= (6, 1):
        return str(compiler.quote_name(name))
    return compiler.quote_name_unless_alias(name)
