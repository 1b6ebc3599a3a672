"""MariaDB 10.6+/MySQL 8 claims: ``SELECT ... FOR UPDATE SKIP LOCKED``, ``UPDATE`` by primary key, read back.

See https://mariadb.com/kb/en/select/#skip-locked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import DateTimeField, Expression, Field, Func
from django.db.models.functions import Now

from lockkit.backends.sql.claims import Row
from lockkit.backends.sql.serial import SerialClaimsSQL


class UTCTimestamp(Func):
    """MariaDB/MySQL ``UTC_TIMESTAMP(6)``: the server clock in UTC, fixed for the statement, microseconds.

    Django stores aware datetimes in MariaDB as naive UTC (the connection's ``TIME_ZONE`` is UTC by default), so
    the session time zone must not shift the value (``NOW()`` would).
    """

    template = "UTC_TIMESTAMP(6)"
    output_field = DateTimeField()


class MySQLClaimsSQL(SerialClaimsSQL):
    """MariaDB 10.6+ and MySQL 8: ``SELECT ... FOR UPDATE SKIP LOCKED``, ``UPDATE``, then read the rows back.

    The database clock is ``UTC_TIMESTAMP(6)`` (with ``USE_TZ``; ``NOW(6)`` without), fixed per statement.
    """

    vendor = "mysql"

    def now(self) -> Expression:
        """``UTC_TIMESTAMP(6)`` with ``USE_TZ`` (values are stored as naive UTC), else Django's ``Now()``."""
        return UTCTimestamp() if settings.USE_TZ else Now()

    def lock_clause(self, *, skip_locked: bool) -> str:
        """``FOR UPDATE [SKIP LOCKED]`` (no ``OF``, no ``NO KEY``: MariaDB has neither)."""
        return connections[self.alias].ops.for_update_sql(skip_locked=skip_locked)

    def write(
        self,
        pks: Sequence[Any],
        values: dict[str, Any],
        condition: str = "",
        fields: Sequence[Field[Any, Any]] = (),
        condition_params: Sequence[Any] = (),
    ) -> list[Row]:
        """``UPDATE`` then ``SELECT`` the written rows back (MariaDB has no ``UPDATE ... RETURNING``).

        The rows are locked by this transaction, so what is read back is what was written.
        """
        update, params = self.update(values)
        extra = f" AND {condition}" if condition else ""
        self.run(f"{update} WHERE {self.where_pks(pks)}{extra}", [*params, *pks, *condition_params])
        rows, _ = self.run(
            f"SELECT {self.returning(fields)} FROM {self.table.name} WHERE {self.where_pks(pks)}", list(pks)
        )
        return [self.typed(row) for row in rows]

    def write_pks(
        self, pks: Sequence[Any], values: dict[str, Any], condition: str, condition_params: Sequence[Any]
    ) -> list[Any]:
        """``UPDATE``, then read back which of the (locked) rows it unclaimed."""
        update, params = self.update(values)
        where = self.where_pks(pks)
        self.run(f"{update} WHERE {where} AND {condition}", [*params, *pks, *condition_params])
        lease = self.table.column("lease_expires_at")
        rows, _ = self.run(
            f"SELECT {self.table.pk_of()} FROM {self.table.name} WHERE {where} AND {lease} IS NULL", list(pks)
        )
        return [next(iter(row.values())) for row in rows]

    def typed(self, row: Row) -> Row:
        """The row with its lease as an aware ``datetime``."""
        return {**row, "lease_expires_at": self.read_datetime(row["lease_expires_at"])}
