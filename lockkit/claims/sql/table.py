"""The quoted names of a ``Claimable`` model's table and columns on one database, read from model metadata.

Identifiers come from ``Model._meta`` and the connection's ``quote_name``, once, and are never parsed back out of
SQL text (a dotted column name or a schema-qualified ``db_table`` stays intact).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.db import connections
from django.db.models import Field, Model

from lockkit.backends.sql.relations import BASE_ALIAS

#: The fields ``lockkit.claims.Claimable`` adds; lockkit writes them and refuses them in a ``set=`` mapping.
CLAIM_FIELDS = ("claimed_by", "claim_token", "claimed_at", "lease_expires_at", "attempts")

#: The longest worker name ``claimed_by`` stores.
WORKER_MAX_LENGTH = 255

#: The alias every claims statement gives the job table where it needs one (``FOR UPDATE OF`` takes only an
#: unqualified name, so a schema-qualified table is always locked through this alias).
ROW = f'"{BASE_ALIAS}"'

# A type modifier: varchar(12), numeric(5, 2). An explicit cast to such a type truncates or rounds.
_MODIFIER = re.compile(r"\s*\([^)]*\)")


@dataclass(frozen=True)
class ClaimTable:
    """A ``Claimable`` model's table on one database alias, with its identifiers quoted for that database.

    Attributes:
        model: The ``Claimable`` model.
        alias: The database alias the names are quoted for.
        name: The quoted table name (``"jobs"``, or ``"queue"."jobs"`` for ``db_table = 'queue"."jobs'``).
        pk: The quoted primary-key column (unqualified).
        columns: The quoted column of each claim field (``CLAIM_FIELDS``), unqualified.
        pk_type: The SQL type the primary key is compared as, without type modifiers (``varchar``, not
            ``varchar(12)``: an explicit cast to ``varchar(12)`` truncates, to ``numeric(5, 2)`` rounds).
    """

    model: type[Model]
    alias: str
    name: str
    pk: str
    columns: dict[str, str]
    pk_type: str

    @classmethod
    def of(cls, model: type[Model], alias: str) -> ClaimTable:
        """Build the descriptor of ``model``'s table as the database behind ``alias`` names it."""
        connection = connections[alias]
        quote = connection.ops.quote_name
        meta = model._meta
        pk = meta.pk
        assert pk is not None
        assert pk.column is not None
        columns: dict[str, str] = {}
        for field_name in CLAIM_FIELDS:
            field = meta.get_field(field_name)
            assert isinstance(field, Field)
            assert field.column is not None
            columns[field_name] = quote(field.column)
        cast = pk.cast_db_type(connection)
        assert cast is not None
        return cls(
            model=model,
            alias=alias,
            name=quote(meta.db_table),
            pk=quote(pk.column),
            columns=columns,
            pk_type=_MODIFIER.sub("", cast),
        )

    def column(self, field_name: str, table: str | None = None) -> str:
        """A claim field's column qualified by ``table`` (the full table name by default)."""
        return f"{table or self.name}.{self.columns[field_name]}"

    def pk_of(self, table: str | None = None) -> str:
        """The primary-key column qualified by ``table`` (the full table name by default)."""
        return f"{table or self.name}.{self.pk}"
