"""PostgreSQL claims: one statement per operation, with data-modifying CTEs and ``RETURNING``.

See https://www.postgresql.org/docs/current/sql-select.html#SQL-FOR-UPDATE-SHARE and
https://www.postgresql.org/docs/current/queries-with.html#QUERIES-WITH-MODIFYING.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Expression, Field, QuerySet

from lockkit._engine import cursors, message
from lockkit._engine.message import Row
from lockkit.claims.sql.base import CLOCK, ClaimsSQL
from lockkit.claims.sql.table import ROW, ClaimTable

#: A fenced write's test that the row still carries the claim, live: one row comparison, which no index can serve, so
#: the primary key is the only way to the row. Written as three conditions, ``claimed_by = %s`` could be planned as
#: a scan of an index on ``claimed_by`` (the task table has one) and ``lease_expires_at IS NOT NULL`` as one of the
#: lease's index: statistics gathered while no row was claimed call any worker name, and any lease, rare, and such
#: a plan reads every row the worker ever claimed (0.48 ms per completion after 2,000 tasks, against 0.1 ms).
_LIVE = "({token}, {worker}, {lease} IS NOT NULL) IS NOT DISTINCT FROM"


class PostgreSQLClaimsSQL(ClaimsSQL):
    """Claims on PostgreSQL: one statement per operation, with data-modifying CTEs and ``RETURNING``."""

    vendor = "postgresql"
    fences_in_one = True

    def __init__(self, table: ClaimTable) -> None:
        """Build the statements of ``table``; the claimable condition is compiled on first use."""
        super().__init__(table)
        self._claimable: dict[bool, tuple[str, list[Any]]] = {}

    def now(self) -> Expression:
        """``statement_timestamp()`` (see ``StatementTimestamp``): one shared expression, reused by every claim."""
        return CLOCK

    def claimable_sql(self, *, expired: bool) -> tuple[str, list[Any]]:
        """As the base's, kept per ``expired``: ``statement_timestamp()`` compiles to the same text every time."""
        kept = self._claimable.get(expired)
        if kept is None:
            kept = self._claimable[expired] = super().claimable_sql(expired=expired)
        return kept[0], list(kept[1])

    def run(self, sql: str, params: Sequence[Any]) -> tuple[list[Row], int]:
        """Execute one statement; inside a claims call outside any transaction, as one message with its opening.

        The message (``message.OneMessage``) is ``BEGIN; SELECT set_config(...); <statement>; COMMIT``; its errors
        are translated by the claims runner that set it up (which knows the call's timeouts).
        """
        sending = message.current()
        if sending is None:
            return super().run(sql, params)
        with cursors.kept(connections[self.alias]) as cursor:
            return sending.run(cursor, sql, params)

    def claim_row(self, pk: Any, values: dict[str, Any]) -> Row:
        """``UPDATE ... WHERE pk = %s RETURNING ...`` (the caller holds the row lock)."""
        update, params = self.update(values)
        statement = f"{update} WHERE {self.table.pk_of()} = %s RETURNING {self.returning()}"
        (row,), _ = self.run(statement, [*params, pk])
        return row

    def claim_next(
        self,
        candidates: QuerySet[Any] | Callable[[], QuerySet[Any]],
        limit: int,
        values: dict[str, Any],
        fields: Sequence[Field[Any, Any]] = (),
        *,
        reuse: tuple[QuerySet[Any], Hashable] | None = None,
        expired: bool = False,
    ) -> list[Row]:
        """One statement: a ``MATERIALIZED`` CTE picks and locks, an ``UPDATE`` joined to it claims.

        The update is never ``WHERE pk IN (subquery with LIMIT)``, which a plan may re-evaluate and so claim
        more than ``limit`` rows; the CTE is evaluated exactly once. With ``limit=1`` the pick is a scalar
        subquery, ``WHERE pk = (SELECT ... LIMIT 1 ... SKIP LOCKED)``: uncorrelated, so PostgreSQL runs it once
        (an InitPlan), and the statement is about half as costly to parse and plan as the CTE form.
        """
        picked = self.picked_pks(candidates, limit, reuse)
        if picked is None:
            return []
        select, select_params = picked
        update, set_params = self.update(values)
        table = self.table
        # statement_timestamp() has no parameter: the re-check is the same text for every call.
        claimable = self.claimable_sql(expired=expired)[0]
        if limit == 1 and not self.qualified:
            # Not for a schema-qualified table: its SELECT names the table by an alias (``FOR UPDATE OF`` refuses
            # a qualified name), so SQL of the caller's naming the table itself (``.extra()``, ``RawSQL``) would
            # bind to the outer UPDATE and correlate the subquery, run once per row. The CTE form refuses it.
            statement = f"{update} WHERE {table.pk_of()} = ({select}) AND {claimable} RETURNING {self.returning(fields)}"
            rows, _ = self.run(statement, [*set_params, *select_params])
            return rows
        statement = (
            f'WITH "lockkit_picked" (pk) AS MATERIALIZED ({select}), '
            f'"lockkit_ordered" (pk, position) AS MATERIALIZED '
            f'(SELECT pk, row_number() OVER () FROM "lockkit_picked") '
            f'{update} FROM "lockkit_ordered" WHERE {table.pk_of()} = "lockkit_ordered".pk '
            f"AND {claimable} "
            f'RETURNING {self.returning(fields)}, "lockkit_ordered".position AS "position"'
        )
        rows, _ = self.run(statement, [*select_params, *set_params])
        rows.sort(key=lambda row: int(row["position"]))
        return rows

    def fenced_update(
        self, pks: Sequence[Any], tokens: Sequence[int], workers: Sequence[str], values: dict[str, Any]
    ) -> list[Row]:
        """One statement: lock the live rows in a ``MATERIALIZED`` CTE, update them only if all are live.

        Live: the row carries the claim's token and worker name and is claimed. The update runs only when as
        many distinct rows are live as claims were given.

        The primary keys travel as an array (one claim: a value) of the column's type without modifiers, so
        each is compared exactly as given (a cast to ``varchar(12)`` would truncate, to ``numeric(5, 2)`` would
        round). One claim is written by a guarded ``UPDATE ... WHERE pk = %s AND <token, worker, claimed>
        RETURNING``: for one row, live and written are the same, and the plain statement is cheaper to parse and
        plan.
        """
        table = self.table
        if len(pks) == 1:
            rows, _ = self.run(*self.fenced_one(pks[0], tokens[0], workers[0], values))
            return rows
        update, set_params = self.update(values)
        token, lease = table.column("claim_token", ROW), table.column("lease_expires_at", ROW)
        worker = table.column("claimed_by", ROW)
        statement = (
            f'WITH "lockkit_given" (pk, token, worker) AS '
            f"(SELECT * FROM unnest(%s::{table.pk_type}[], %s::bigint[], %s::text[])), "
            f'"lockkit_live" (pk) AS MATERIALIZED (SELECT {table.pk_of(ROW)} FROM {table.name} AS {ROW} '
            f'JOIN "lockkit_given" ON {table.pk_of(ROW)} = "lockkit_given".pk '
            f"AND {_LIVE.format(token=token, worker=worker, lease=lease)} "
            f'("lockkit_given".token, "lockkit_given".worker, true) '
            f"FOR NO KEY UPDATE OF {ROW}), "
            f'"lockkit_done" AS ({update} FROM "lockkit_live" WHERE {table.pk_of()} = "lockkit_live".pk '
            f'AND (SELECT count(DISTINCT pk) FROM "lockkit_live") = %s '
            f"RETURNING {table.pk_of()} AS pk, {table.column('lease_expires_at')} AS lease) "
            f'SELECT "lockkit_live".pk AS "pk", "lockkit_done".pk IS NOT NULL AS "written", '
            f'"lockkit_done".lease AS "lease_expires_at" '
            f'FROM "lockkit_live" LEFT JOIN "lockkit_done" ON "lockkit_done".pk = "lockkit_live".pk'
        )
        rows, _ = self.run(statement, [list(pks), list(tokens), list(workers), *set_params, len(pks)])
        return rows

    def fenced_one(self, pk: Any, token: int, worker: str, values: dict[str, Any]) -> tuple[str, list[Any]]:
        """``UPDATE ... WHERE pk = %s AND <token, worker, claimed> RETURNING``: the fenced write of one claim."""
        table = self.table
        update, set_params = self.update(values)
        # Parenthesised: a client-side bound negative number is written `-9223372036854775808`, and without
        # them `::` would bind before the minus and cast the out-of-range 9223372036854775808.
        live = _LIVE.format(
            token=table.column("claim_token"),
            worker=table.column("claimed_by"),
            lease=table.column("lease_expires_at"),
        )
        statement = (
            f"{update} WHERE {table.pk_of()} = (%s)::{table.pk_type} "
            f"AND {live} ((%s)::bigint, (%s)::text, true) "
            f'RETURNING {table.pk_of()} AS "pk", true AS "written", '
            f'{table.column("lease_expires_at")} AS "lease_expires_at"'
        )
        return statement, [*set_params, pk, token, worker]

    def renew_worker(self, held: QuerySet[Any], worker: str, values: dict[str, Any]) -> tuple[list[Row], Any]:
        """One statement: renew the worker's unexpired claims, and read the clock (one row even when none).

        The ``UPDATE`` re-checks worker and lease on each row after any lock wait (a claim completed meanwhile is
        left alone); the clock comes back on a row of its own joined to the renewed ones, so an empty result still
        says when the statement ran.
        """
        try:
            select, select_params = held.order_by().values("pk").query.get_compiler(self.alias).as_sql()
        except EmptyResultSet:
            return [], None
        update, set_params = self.update(values)
        table = self.table
        statement = (
            f'WITH "lockkit_renewed" AS ({update} WHERE {table.pk_of()} IN ({select}) '
            f"AND {table.column('claimed_by')} = (%s)::text "
            f"AND {table.column('lease_expires_at')} > statement_timestamp() "
            f'RETURNING {table.pk_of()} AS "pk", {table.column("claim_token")} AS "claim_token") '
            f'SELECT "lockkit_renewed".pk AS "pk", "lockkit_renewed".claim_token AS "claim_token", '
            f'statement_timestamp() AS "now" FROM (SELECT 1) AS "lockkit_one" '
            f'LEFT JOIN "lockkit_renewed" ON true'
        )
        rows, _ = self.run(statement, [*set_params, *select_params, worker])
        clock = rows[0]["now"] if rows else None
        return [row for row in rows if row["pk"] is not None], clock

    def reclaim_expired(self, candidates: QuerySet[Any], values: dict[str, Any]) -> list[Any]:
        """One statement: lock the expired rows (``SKIP LOCKED``), re-check the lease on each row updated.

        A claim renewed or completed while this runs is left alone.
        """
        expired = candidates.order_by().filter(lease_expires_at__lt=self.now())
        picked = self.select_pks(expired, limit=None, skip_locked=True)
        if picked is None:
            return []
        select, select_params = picked
        update, set_params = self.update(values)
        table = self.table
        statement = (
            f'WITH "lockkit_expired" (pk) AS MATERIALIZED ({select}) '
            f'{update} FROM "lockkit_expired" WHERE {table.pk_of()} = "lockkit_expired".pk '
            f"AND {table.column('lease_expires_at')} < statement_timestamp() "
            f'RETURNING {table.pk_of()} AS "pk"'
        )
        rows, _ = self.run(statement, [*select_params, *set_params])
        return [row["pk"] for row in rows]
