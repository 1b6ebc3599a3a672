"""Claims on MariaDB/MySQL and SQLite: a few statements in one short transaction (the claims runner's scope).

Neither has PostgreSQL's data-modifying CTEs, and MariaDB has no ``UPDATE ... RETURNING``, so each operation picks
its rows first, then writes them by primary key, inside one transaction that holds the rows until it commits.
MariaDB 10.6+/MySQL 8 lock the picked rows (``FOR UPDATE SKIP LOCKED``); SQLite has no row locks, and its
transaction begins with ``BEGIN IMMEDIATE``, which takes the database write lock, so writers run one at a time.
See https://mariadb.com/kb/en/select/#skip-locked and https://www.sqlite.org/lang_returning.html.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Field, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from lockkit._engine.message import Row
from lockkit.claims.sql.base import ClaimsSQL

# Rows written per UPDATE by reclaim_expired (a parameter list per statement stays far below every driver limit).
_CHUNK = 500


class SerialClaimsSQL(ClaimsSQL):
    """Claims as "pick, then write by primary key" inside one short transaction (see the module docstring)."""

    @abc.abstractmethod
    def lock_clause(self, *, skip_locked: bool) -> str:
        """The clause appended to a ``SELECT`` that picks rows to write (empty where rows cannot be locked)."""

    @abc.abstractmethod
    def write(
        self,
        pks: Sequence[Any],
        values: dict[str, Any],
        condition: str = "",
        fields: Sequence[Field[Any, Any]] = (),
        condition_params: Sequence[Any] = (),
    ) -> list[Row]:
        """``UPDATE ... WHERE pk IN (pks) [AND condition]``; return the written rows' ``CLAIM_COLUMNS``."""

    def read_datetime(self, value: Any) -> Any:
        """A ``DATETIME`` the driver returned, as the model field reads it (aware with ``USE_TZ``)."""
        if value is None:
            return None
        if isinstance(value, str):
            value = parse_datetime(value)
        if settings.USE_TZ and value is not None and timezone.is_naive(value):
            value = timezone.make_aware(value, connections[self.alias].timezone)
        return value

    def pick(
        self,
        queryset: QuerySet[Any],
        *,
        limit: int | None,
        skip_locked: bool,
        locking: bool = True,
        offset: int = 0,
    ) -> list[Any]:
        """Run ``SELECT pk ... [ORDER BY ... LIMIT n OFFSET m] [<lock clause>]``; return the primary keys in order."""
        selection = queryset.values_list("pk")
        if limit is not None:
            selection = selection[offset : offset + limit]
        try:
            select, params = selection.query.get_compiler(self.alias).as_sql()
        except EmptyResultSet:  # .none(), pk__in=[]: no row can match
            return []
        lock = self.lock_clause(skip_locked=skip_locked) if locking else ""
        rows, _ = self.run(f"{select} {lock}".strip(), params)
        return [next(iter(row.values())) for row in rows]

    def where_pks(self, pks: Sequence[Any]) -> str:
        """``<pk> IN (%s, ...)`` for ``pks`` (never empty)."""
        return f"{self.table.pk_of()} IN ({', '.join(['%s'] * len(pks))})"

    def claim_row(self, pk: Any, values: dict[str, Any]) -> Row:
        """Write the claim to the row the caller locked (``claim()`` runs inside its own locked scope)."""
        (row,) = self.write([pk], values)
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
        """Pick up to ``limit`` free rows in order (skipping locked ones), then claim them, in one transaction.

        ``reuse`` is accepted for the interface and not used: the picking ``SELECT`` is compiled per call here.
        """
        queryset = candidates if isinstance(candidates, QuerySet) else candidates()
        pks = self.pick(queryset, limit=limit, skip_locked=True)
        if not pks:
            return []
        condition, condition_params = self.claimable_sql(expired=expired)
        rows = self.write(pks, values, condition, fields, condition_params)
        position = {pk: index for index, pk in enumerate(pks)}
        rows.sort(key=lambda row: position[row["pk"]])
        return rows

    def fenced_update(
        self, pks: Sequence[Any], tokens: Sequence[int], workers: Sequence[str], values: dict[str, Any]
    ) -> list[Row]:
        """Lock the claimed rows, compare token and worker exactly, write all of them or none.

        The comparison happens here, in Python, so a case- or accent-insensitive collation cannot make
        ``"W1"`` match a row claimed by ``"w1"``.
        """
        table = self.table
        pk_field = table.model._meta.pk
        assert pk_field is not None
        same = pk_field.to_python  # the driver's value and the prepared one, compared as the field reads them
        given = {(same(pk), token, worker) for pk, token, worker in zip(pks, tokens, workers, strict=True)}
        rows, _ = self.run(
            f"SELECT {table.pk_of()}, {table.column('claim_token')}, {table.column('claimed_by')} "
            f"FROM {table.name} WHERE {self.where_pks(pks)} "
            f"AND {table.column('lease_expires_at')} IS NOT NULL {self.lock_clause(skip_locked=False)}",
            list(pks),
        )
        live = [
            pk
            for pk, token, worker in (tuple(row.values()) for row in rows)
            if (same(pk), token, worker) in given
        ]
        if len(set(live)) != len(pks):
            return [{"pk": pk, "written": False, "lease_expires_at": None} for pk in live]
        written = self.write(live, values)
        return [
            {"pk": row["pk"], "written": True, "lease_expires_at": row["lease_expires_at"]} for row in written
        ]

    def renew_worker(self, held: QuerySet[Any], worker: str, values: dict[str, Any]) -> tuple[list[Row], Any]:
        """Lock the worker's unexpired claims in primary-key order (waiting), renew them by primary key.

        Token and worker are compared here, in Python, as ``fenced_update`` does (a case-insensitive collation
        must not make ``"W1"`` renew the claims of ``"w1"``).
        """
        table = self.table
        clock_sql, clock_params = self.compile(self.now())
        selection = held.order_by("pk").values_list("pk", "claim_token", "claimed_by")
        try:
            select, params = selection.query.get_compiler(self.alias).as_sql()
        except EmptyResultSet:
            return [], None
        found, _ = self.run(f"{select} {self.lock_clause(skip_locked=False)}".strip(), params)
        rows = [
            {"pk": pk, "claim_token": token}
            for pk, token, name in (tuple(row.values()) for row in found)
            if name == worker
        ]
        (clock_row,), _ = self.run(f"SELECT {clock_sql}", clock_params)
        clock = self.read_datetime(next(iter(clock_row.values())))
        if rows:
            pks = [row["pk"] for row in rows]
            update, set_params = self.update(values)
            lease = table.column("lease_expires_at")
            for start in range(0, len(pks), _CHUNK):
                chunk = pks[start : start + _CHUNK]
                self.run(
                    f"{update} WHERE {self.where_pks(chunk)} AND {lease} IS NOT NULL", [*set_params, *chunk]
                )
        return rows, clock

    def reclaim_expired(self, candidates: QuerySet[Any], values: dict[str, Any]) -> list[Any]:
        """Pick the expired rows (skipping locked ones), write them, re-checking the lease on each row."""
        expired = candidates.order_by().filter(lease_expires_at__lt=self.now())
        lease = self.table.column("lease_expires_at")
        handed_back: list[Any] = []
        pks = self.pick(expired, limit=None, skip_locked=True)
        now_sql, now_params = self.compile(self.now())
        for start in range(0, len(pks), _CHUNK):
            chunk = pks[start : start + _CHUNK]
            handed_back += self.write_pks(chunk, values, f"{lease} < {now_sql}", now_params)
        return handed_back

    @abc.abstractmethod
    def write_pks(
        self, pks: Sequence[Any], values: dict[str, Any], condition: str, condition_params: Sequence[Any]
    ) -> list[Any]:
        """``UPDATE ... WHERE pk IN (pks) AND condition``; return the primary keys written."""
