"""MariaDB 10.6+/MySQL 8 claims: candidates read without locking, locked by primary key, updated, read back.

See https://mariadb.com/kb/en/select/#skip-locked and
https://dev.mysql.com/doc/refman/8.0/en/innodb-locks-set.html.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import DateTimeField, Expression, Field, Func, QuerySet
from django.db.models.functions import Now

from lockkit._engine.message import Row
from lockkit.claims.sql.base import zoneless
from lockkit.claims.sql.serial import SerialClaimsSQL


class UTCTimestamp(Func):
    """MariaDB/MySQL ``UTC_TIMESTAMP(6)``: the server clock in UTC, fixed for the statement, microseconds.

    Django stores aware datetimes in MariaDB as naive UTC (the connection's ``TIME_ZONE`` is UTC by default), so
    the session time zone must not shift the value (``NOW()`` would).
    """

    template = "UTC_TIMESTAMP(6)"
    output_field = DateTimeField()


# One object each, reused by every claim (``ClaimsSQL.update`` keeps Django's compilation of the same objects).
_UTC_CLOCK, _CLOCK = zoneless(UTCTimestamp()), zoneless(Now())


class MySQLClaimsSQL(SerialClaimsSQL):
    """MariaDB 10.6+ and MySQL 8: ``SELECT ... FOR UPDATE SKIP LOCKED``, ``UPDATE``, then read the rows back.

    The database clock is ``UTC_TIMESTAMP(6)`` (with ``USE_TZ``; ``NOW(6)`` without), fixed per statement.
    """

    vendor = "mysql"

    def now(self) -> Expression:
        """``UTC_TIMESTAMP(6)`` with ``USE_TZ`` (values are stored as naive UTC), else Django's ``Now()``."""
        return _UTC_CLOCK if settings.USE_TZ else _CLOCK

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
        """Pick candidates in order without locking, lock the first free ones by primary key, claim them.

        InnoDB locks every row a locking read examines, and ``ORDER BY`` a column no index covers examines every
        candidate before the sort: ``SELECT ... ORDER BY <unindexed> LIMIT n FOR UPDATE SKIP LOCKED`` locked all
        of them, so one claim in flight hid every free job from the others (empty polls). Here a plain ``SELECT``
        reads the candidates' primary keys in the order asked (``limit`` plus a margin, ``_candidates``), then
        ``SELECT pk ... WHERE <the queryset's filters and the claimable condition> AND pk IN (<next batch>) FOR
        UPDATE SKIP LOCKED`` locks them batch by batch in that order, examining only the batch's rows, until
        ``limit`` are locked or the candidates run out. The rows claimed are the first ``limit`` candidates, in
        the order asked, that no other session holds: what ``SKIP LOCKED`` promises. The locking statement
        re-checks every condition on the row's latest version, so a row completed or claimed since the plain
        ``SELECT`` is not taken.

        A batch holds no more rows than are still needed while fewer than ``_EXACT_SKIPS`` rows were skipped:
        every free row it locks is claimed (a row locked and not taken stays locked until this transaction
        commits, and hides a free job from the other claims meanwhile: an empty poll while a job waits). Past
        that (many rows ahead held by others: a long transaction of the caller's, say), batches double, so a
        claim takes a number of statements logarithmic in the rows held ahead; a row it locked beyond those
        taken is hidden only until it commits. A window of candidates all held by others, or claimed since it
        was read, is followed by a window twice as large of the candidates not yet tried, read again (under
        Django's default ``READ COMMITTED`` each plain ``SELECT`` sees the latest commits, so an ``OFFSET`` past
        the first window could skip free rows, or land past the end, while others claim), until a window is
        short: the answer is empty only when no candidate was free. A candidate listed twice (a filter across a
        multi-valued relation) is tried once.
        """
        queryset = candidates if isinstance(candidates, QuerySet) else candidates()
        size = _candidates(limit)
        picked: list[Any] = []
        tried: list[Any] = []
        skipped = batch_size = 0
        while True:
            unseen = queryset.exclude(pk__in=tried) if tried else queryset
            listed = self.pick(unseen, limit=size, skip_locked=False, locking=False)
            window = list(dict.fromkeys(listed))
            start = 0
            while len(picked) < limit and start < len(window):
                needed = limit - len(picked)
                batch_size = needed if skipped < _EXACT_SKIPS else max(needed, 2 * batch_size)
                batch = window[start : start + batch_size]
                start += len(batch)
                locked = set(self.lock_by_pk(queryset, batch))
                picked += [pk for pk in batch if pk in locked][:needed]
                skipped += sum(1 for pk in batch if pk not in locked)
            if len(picked) == limit or len(listed) < size:
                break
            tried += window
            size = min(2 * size, _MAX_WINDOW)
        if not picked:
            return []
        condition, condition_params = self.claimable_sql(expired=expired)
        rows = self.write(picked, values, condition, fields, condition_params)
        position = {pk: index for index, pk in enumerate(picked)}
        rows.sort(key=lambda row: position[row["pk"]])
        return rows

    def lock_by_pk(self, queryset: QuerySet[Any], pks: Sequence[Any]) -> list[Any]:
        """``SELECT pk ... FORCE INDEX (PRIMARY) WHERE <filters> AND pk IN (pks) FOR UPDATE SKIP LOCKED``.

        The primary key is forced so InnoDB examines (and locks) the listed rows only: through a secondary index
        (``lease_expires_at IS NULL`` matches every free row) it would lock rows outside the list while it scans,
        and a concurrent claim would skip them. A queryset that joins other tables (a filter across a relation)
        is not locked with its join: MariaDB has no ``FOR UPDATE OF``, so the related rows would be locked too,
        and a session holding one (another claim in flight, an edit of the parent row) would hide every job
        joined to it. The listed rows are locked by primary key alone, then the filters are checked on them
        (locked, their own columns cannot change meanwhile); one that no longer matches is not taken.
        """
        selection = queryset.filter(pk__in=pks).order_by().values_list("pk")
        try:
            select, params = selection.query.get_compiler(self.alias).as_sql()
        except EmptyResultSet:
            return []
        table = f" FROM {self.table.name}"
        if sum(1 for count in selection.query.alias_refcount.values() if count) > 1:  # joined
            lock = f"SELECT {self.table.pk_of()}{table} FORCE INDEX (PRIMARY) WHERE {self.where_pks(pks)}"
            rows, _ = self.run(f"{lock} {self.lock_clause(skip_locked=True)}", list(pks))
            locked = {next(iter(row.values())) for row in rows}
            if not locked:
                return []
            rows, _ = self.run(select, params)  # the filters, on the rows now locked (no locking read)
            return [pk for pk in (next(iter(row.values())) for row in rows) if pk in locked]
        at = select.find(table)
        if at != -1 and select.find(table, at + 1) == -1:
            end = at + len(table)
            select = f"{select[:end]} FORCE INDEX (PRIMARY){select[end:]}"
        rows, _ = self.run(f"{select} {self.lock_clause(skip_locked=True)}", params)
        return [next(iter(row.values())) for row in rows]

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


#: Rows skipped (held by others, or no longer claimable) before a claim's locking batches may hold more rows
#: than it still needs (see ``claim_next``).
_EXACT_SKIPS = 8


def _candidates(limit: int) -> int:
    """How many candidates one window reads: the rows asked for, plus room for the claims of other workers.

    Bounded so that it stays within ``LIMIT``'s range (a ``limit`` may be as large as a bigint).
    """
    return min(limit * 4 + 32, _MAX_WINDOW)


_MAX_WINDOW = 2**62
