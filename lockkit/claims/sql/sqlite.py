"""SQLite 3.35+ claims: ``BEGIN IMMEDIATE`` serialises the writers; ``UPDATE ... RETURNING``.

See https://www.sqlite.org/lang_returning.html.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Expression, Field
from django.db.models.functions import Now

from lockkit._engine.message import Row
from lockkit.claims.sql.base import zoneless
from lockkit.claims.sql.serial import SerialClaimsSQL

# One object, reused by every claim (``ClaimsSQL.update`` keeps Django's compilation of the same objects).
_CLOCK = zoneless(Now())


class SQLiteClaimsSQL(SerialClaimsSQL):
    """SQLite 3.35+: ``BEGIN IMMEDIATE`` serialises the writers; ``UPDATE ... RETURNING``.

    The clock is the clock of the machine running the statement (SQLite is a library: ``STRFTIME(..., 'now')``
    in UTC, milliseconds), so workers sharing a database file share that machine's clock.
    """

    vendor = "sqlite"

    def now(self) -> Expression:
        """Django's ``Now()``: ``STRFTIME('%Y-%m-%d %H:%M:%f', 'now')``, UTC, as Django stores datetimes."""
        return _CLOCK

    def lock_clause(self, *, skip_locked: bool) -> str:
        """Nothing: the transaction already holds the database write lock."""
        return ""

    def write(
        self,
        pks: Sequence[Any],
        values: dict[str, Any],
        condition: str = "",
        fields: Sequence[Field[Any, Any]] = (),
        condition_params: Sequence[Any] = (),
    ) -> list[Row]:
        """``UPDATE ... WHERE pk IN (...) RETURNING`` the claim columns."""
        update, params = self.update(values)
        extra = f" AND {condition}" if condition else ""
        rows, _ = self.run(
            f"{update} WHERE {self.where_pks(pks)}{extra} RETURNING {self.returning(fields)}",
            [*params, *pks, *condition_params],
        )
        return [{**row, "lease_expires_at": self.read_datetime(row["lease_expires_at"])} for row in rows]

    def write_pks(
        self, pks: Sequence[Any], values: dict[str, Any], condition: str, condition_params: Sequence[Any]
    ) -> list[Any]:
        """``UPDATE ... RETURNING`` the primary keys written."""
        update, params = self.update(values)
        rows, _ = self.run(
            f'{update} WHERE {self.where_pks(pks)} AND {condition} RETURNING {self.table.pk_of()} AS "pk"',
            [*params, *pks, *condition_params],
        )
        return [row["pk"] for row in rows]
