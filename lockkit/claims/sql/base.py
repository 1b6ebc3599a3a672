"""Every SQL statement of ``lockkit.claims``, built per database vendor behind one interface (``ClaimsSQL``).

Statements are assembled from Django's own compilers (filters, ``SET`` values) and the quoted names of a
``ClaimTable``; every value is a parameter. Rows come back as mappings keyed by column name. See
https://www.postgresql.org/docs/current/sql-select.html#SQL-FOR-UPDATE-SHARE and
https://www.postgresql.org/docs/current/queries-with.html#QUERIES-WITH-MODIFYING.
"""

from __future__ import annotations

import abc
import contextlib
import functools
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import (
    Choices,
    DateTimeField,
    DurationField,
    Expression,
    F,
    Field,
    Func,
    Q,
    QuerySet,
    Value,
)
from django.db.models.expressions import BaseExpression, Combinable
from django.db.models.sql import UpdateQuery
from django.db.models.sql.datastructures import BaseTable
from django.utils import timezone

from lockkit._engine import cursors
from lockkit._engine.message import Row, read_rows
from lockkit.backends.sql import relations
from lockkit.claims.sql.memo import ZONE_SETTINGS, PerQueryset
from lockkit.claims.sql.table import ClaimTable
from lockkit.errorcodes.translate import translating


def fetched_column(index: int) -> str:
    """The name a claiming statement gives the ``index``-th model column it returns for ``fetch=True``."""
    return f"lockkit_f{index}"


#: One result row, keyed by the names the statement gives its columns.

#: The columns a claim is read from (``Claim.from_row``), in the names every claiming statement returns them as.
CLAIM_COLUMNS = ("pk", "claim_token", "claimed_by", "lease_expires_at", "attempts")


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


#: Expressions lockkit built that compile the same in every time zone (no ``Trunc``, ``Extract`` or other function
#: of the current time zone inside), each kept alive here so that its id names it: ``identical()`` leaves the time
#: zone out of the key of assignments made of them and plain values. Reading the current time zone (asgiref's
#: ``Local``) cost a worker about 4 % of its instructions per task.
_ZONELESS: dict[int, BaseExpression | Combinable] = {}
_MAX_ZONELESS = 256
_NOT_MARKED = object()

_E = TypeVar("_E", bound="BaseExpression | Combinable | QuerySet[Any]")


def zoneless(built: _E) -> _E:
    """Mark an expression or a candidates queryset lockkit built as compiling the same in every time zone.

    Nothing in it may read the current time zone. Returns ``built``. A marked queryset's picking ``SELECT`` is kept without the time zone in its key (the tasks worker's). Beyond a
    bound, an expression is not marked (its assignments are then keyed by the time zone too, as a caller's are).
    """
    if isinstance(built, QuerySet):
        _SELECTS.zoneless(built)
    elif len(_ZONELESS) < _MAX_ZONELESS:
        _ZONELESS.setdefault(id(built), built)
    return built


CLOCK = zoneless(StatementTimestamp())
_NEXT_TOKEN = zoneless(F("claim_token") + 1)
_NEXT_ATTEMPT = zoneless(F("attempts") + 1)


# claim_next's locking SELECT, compiled once per caller queryset object (``memo``).
_SELECTS: PerQueryset[tuple[str, list[Any]] | None] = PerQueryset()
#: Plain values whose prepared parameter depends only on their type and value (never on the time zone).
_PLAIN = (str, int, bool, type(None))
#: The most ``UPDATE ... SET`` compilations a ``ClaimsSQL`` keeps (a worker sends a few; the rest compile per call).
_MAX_UPDATES = 64


class ClaimsSQL(abc.ABC):
    """The claims statements of one database vendor, for one ``Claimable`` table on one alias.

    Subclasses write the vendor's statements (``lockkit/backends/<vendor>/claims.py``); this base compiles the
    parts Django can compile (``SET`` values, the candidates' filters) and runs statements. A vendor's backend
    names its subclass in ``lockkit.claims.sql._BY_VENDOR``.
    """

    vendor: ClassVar[str]

    #: A fenced write of one claim is one statement (``fenced_one``), which can travel ahead of a claim.
    fences_in_one = False

    def __init__(self, table: ClaimTable) -> None:
        """Build the statements of ``table`` (names already quoted for its alias)."""
        self.table = table
        self.alias = table.alias
        #: Whether the table is schema-qualified (then named by an alias in the locking clause); fixed per alias.
        self.qualified = relations.is_qualified(table.model, table.alias)
        #: Django's ``UPDATE ... SET`` for identical assignments (``update``): text, parameters, the values.
        self._updates: dict[Hashable, tuple[str, tuple[Any, ...], tuple[Any, ...]]] = {}
        #: ``returning()`` per tuple of fields (names quoted for this alias, fixed as the table's).
        self._returning: dict[tuple[Field[Any, Any], ...], str] = {}
        #: The last ``returning()`` asked, by the very sequence of fields (a worker passes the same one each time:
        #: hashing its 20-odd fields on every claim cost more than reading the text).
        self._last_returning: tuple[Sequence[Field[Any, Any]], str] | None = None

    # -- the database clock and the values every claim writes ------------------------------------------------

    @abc.abstractmethod
    def now(self) -> Expression:
        """The database clock as an expression (stable within one statement)."""

    def claimable(self, *, expired: bool) -> Q:
        """The rows a claim may take: free ones, and with ``expired`` those whose lease ended by the clock."""
        free = Q(lease_expires_at__isnull=True)
        return free | Q(lease_expires_at__lte=self.now()) if expired else free

    def claimable_sql(self, *, expired: bool) -> tuple[str, list[Any]]:
        """``claimable()`` as SQL on the job table's own columns, for a statement's re-check of a locked row."""
        lease = self.table.column("lease_expires_at")
        if not expired:
            return f"{lease} IS NULL", []
        now, params = self.compile(self.now())
        return f"({lease} IS NULL OR {lease} <= {now})", params

    def compile(self, expression: Expression) -> tuple[str, list[Any]]:
        """Compile an expression for this alias (the clock, in hand-written statements)."""
        query = QuerySet(self.table.model).query
        compiler = query.get_compiler(self.alias)
        sql, params = compiler.compile(expression.resolve_expression(query))
        return sql, list(params)

    def lease_end(self, lease: float) -> BaseExpression:
        """``<now> + <lease seconds>`` (the interval travels as a parameter), one object per clock and lease.

        A worker claims and renews with the same lease every time, so its assignments are the same objects on
        every call and ``update()`` finds Django's compilation of them.
        """
        return _lease_end(self.now(), lease)

    def claim_assignments(self, worker: str, lease: float, extra: dict[str, Any]) -> dict[str, Any]:
        """What every claim writes: worker, next token, lease, one more attempt, and the caller's fields."""
        return {
            "claimed_by": worker,
            "claim_token": _NEXT_TOKEN,
            "claimed_at": self.now(),
            "lease_expires_at": self.lease_end(lease),
            "attempts": _NEXT_ATTEMPT,
            **extra,
        }

    # -- the operations --------------------------------------------------------------------------------------

    @abc.abstractmethod
    def claim_row(self, pk: Any, values: dict[str, Any]) -> Row:
        """Write ``values`` (a claim) to the row ``pk`` the caller has locked; return its ``CLAIM_COLUMNS``."""

    @abc.abstractmethod
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
        """Claim up to ``limit`` free rows of ``candidates`` (ordered), skipping locked ones.

        ``candidates`` are already filtered by ``claimable(expired=expired)``; the statement re-checks that
        condition on each locked row (``claimable_sql``).

        ``candidates`` may be a zero-argument callable building them, called only when the locking ``SELECT``
        must be compiled; ``reuse`` is ``(the caller's queryset object, a key)`` under which the compiled
        ``SELECT`` is kept while that object lives (see ``picked_pks``).

        Returns the claimed rows' ``CLAIM_COLUMNS`` (and ``fields``, see ``returning()``) in the candidates'
        order.
        """

    @abc.abstractmethod
    def fenced_update(
        self, pks: Sequence[Any], tokens: Sequence[int], workers: Sequence[str], values: dict[str, Any]
    ) -> list[Row]:
        """Write ``values`` to every row in ``pks`` if each is still claimed with its token by its worker.

        All rows are written, or none (also when the database compares two of ``pks`` as the same row).

        Returns one row per live row found: ``pk``, ``written`` (bool), ``lease_expires_at`` (after the write).
        """

    def fenced_one(
        self, pk: Any, token: int, worker: str, values: dict[str, Any]
    ) -> tuple[str, list[Any]] | None:
        """The text and values of ``fenced_update`` for one claim, where it is one statement (``fences_in_one``).

        ``None`` (the default) where a fenced write is several statements (MariaDB/MySQL, SQLite): it then never
        travels ahead of another statement in one message (``lockkit.claims.chaining``).
        """
        return None

    @abc.abstractmethod
    def renew_worker(self, held: QuerySet[Any], worker: str, values: dict[str, Any]) -> tuple[list[Row], Any]:
        """Write ``values`` (a new lease) to every row of ``held`` still claimed by ``worker`` and unexpired.

        ``held`` is already filtered by ``claimed_by = worker`` and an unexpired lease; the write re-checks both
        on each row it changes, after any lock wait.

        Returns the rows renewed (``pk``, ``claim_token``) and the database clock the statement ran at.
        """

    @abc.abstractmethod
    def reclaim_expired(self, candidates: QuerySet[Any], values: dict[str, Any]) -> list[Any]:
        """Write ``values`` to the rows of ``candidates`` whose lease expired; return their primary keys."""

    # -- shared building blocks ------------------------------------------------------------------------------

    def update(self, values: dict[str, Any]) -> tuple[str, list[Any]]:
        """``UPDATE <table> SET <assignments>`` (no ``WHERE``), as Django's update compiler writes it.

        Django prepares each value for its field (``get_db_prep_save``) and compiles expressions (``F``,
        ``Case``, functions); every value is a parameter. Django's output is kept for identical assignments only
        (``identical``): the same fields, each value a ``str``/``int``/``bool``/``None`` or a choices member
        (``TextChoices``, ``IntegerChoices``) holding one, of the same type and value, or the very same expression
        object (lockkit's clock, next token and lease ends are built once), in the same time zone. A worker's
        claims and completions are such calls; anything else compiles per call.

        Raises:
            django.core.exceptions.FieldError: a field name Django does not know.
        """
        key = identical(values)
        kept = None if key is None else self._updates.get(key)
        if kept is not None:
            return kept[0], list(kept[1])
        query = UpdateQuery(self.table.model)
        query.add_update_values(values)
        sql, params = query.get_compiler(self.alias).as_sql()
        if key is not None:
            if len(self._updates) >= _MAX_UPDATES:
                self._updates.clear()
            # The values are kept with it, so an expression's id in the key names that object while it is kept.
            self._updates[key] = (sql, tuple(params), tuple(values.values()))
        return sql, list(params)

    def picked_pks(
        self,
        candidates: QuerySet[Any] | Callable[[], QuerySet[Any]],
        limit: int,
        reuse: tuple[QuerySet[Any], Hashable] | None,
    ) -> tuple[str, list[Any]] | None:
        """``select_pks(candidates, limit=limit, skip_locked=True)``, kept per caller queryset object.

        With ``reuse = (queryset, key)`` the compiled ``SELECT`` is kept while that queryset object lives (a
        queryset never changes through Django's API), per alias, limit, key and time zone.
        """

        def compile_select() -> tuple[str, list[Any]] | None:
            built = candidates() if callable(candidates) else candidates
            return self.select_pks(built, limit=limit, skip_locked=True)

        if reuse is None:
            return compile_select()
        source, key = reuse
        return _SELECTS.get(source, (self.alias, limit, key), compile_select)

    def select_pks(
        self, queryset: QuerySet[Any], *, limit: int | None, skip_locked: bool
    ) -> tuple[str, list[Any]] | None:
        """Compile ``SELECT <pk> FROM <table> ... [ORDER BY ... LIMIT n] FOR NO KEY UPDATE OF <table>``.

        The filters and ordering come from Django's compiler (values as parameters). The locking clause names
        only the job table, so only job rows are locked; a schema-qualified table is named by an alias there
        (``FOR UPDATE OF`` refuses a qualified name). ``FOR NO KEY UPDATE`` lets other sessions insert rows
        that reference the job. ``None`` when no row can match (``.none()``, ``pk__in=[]``).
        """
        selection = queryset.values_list("pk")
        if limit is not None:
            selection = selection[:limit]
        query = selection.query
        base = query.get_initial_alias()
        if not isinstance(query.alias_map[base], BaseTable):  # pragma: no cover - Django invariant
            raise AssertionError(f"cannot find the base table of {query}")
        if self.qualified:
            base = relations.alias_base_table(query)
        compiler = query.get_compiler(self.alias)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:
            return None
        locking = connections[self.alias].ops.for_update_sql(
            skip_locked=skip_locked, of=(relations.quote_as_from_clause(compiler, base),), no_key=True
        )
        return f"{sql} {locking}", list(params)

    def returning(self, fields: Sequence[Field[Any, Any]] = ()) -> str:
        """The ``CLAIM_COLUMNS`` of the updated row, named as ``Claim.from_row`` reads them.

        ``fields`` (the model's concrete fields, for ``fetch=True``) follow as ``lockkit_f0``, ``lockkit_f1``...,
        but for those that are claim columns already (the primary key, the token...): ``fetched_keys`` says where
        each one is.
        """
        last = self._last_returning
        if last is not None and last[0] is fields:
            return last[1]
        key = tuple(fields)
        kept = self._returning.get(key)
        if kept is None:
            kept = self._returning[key] = self._compose_returning(key)
        # Kept by identity only when immutable (the model's concrete_fields is a tuple): then it names one text.
        if isinstance(fields, tuple):
            self._last_returning = (fields, kept)
        return kept

    def fetched_keys(self, fields: Sequence[Field[Any, Any]]) -> list[str]:
        """Where each of ``fields`` is in a row of a statement ``RETURNING returning(fields)``: its column's name.

        A field that is one of the ``CLAIM_COLUMNS`` is read from that column (returned once, not twice: each
        column of a claim's row costs the worker time to read, per task), but the lease: MariaDB's and SQLite's
        claims make it aware in the row, and a model field converts the value as the database returned it. Any
        other is ``lockkit_f<index>``.
        """
        meta = self.table.model._meta
        shared = [name for name in CLAIM_COLUMNS[1:] if name != "lease_expires_at"]
        claim_fields = {meta.pk: "pk"} | {meta.get_field(name): name for name in shared}
        return [claim_fields.get(field) or fetched_column(index) for index, field in enumerate(fields)]

    def _compose_returning(self, fields: tuple[Field[Any, Any], ...]) -> str:
        table = self.table
        quote = connections[self.alias].ops.quote_name
        sources = [table.pk_of(), *(table.column(name) for name in CLAIM_COLUMNS[1:])]
        names = list(CLAIM_COLUMNS)
        for field, name in zip(fields, self.fetched_keys(fields), strict=True):
            assert field.column is not None
            if name not in CLAIM_COLUMNS:
                sources.append(f"{table.name}.{quote(field.column)}")
                names.append(name)
        return ", ".join(f"{source} AS {quote(name)}" for source, name in zip(sources, names, strict=True))

    def run(self, sql: str, params: Sequence[Any]) -> tuple[list[Row], int]:
        """Execute one statement; return its rows keyed by column name, and its row count.

        Inside ``bounded(prefix)`` the statement carries the backend's statement-scoped timeouts (``prefix``).
        """
        connection = connections[self.alias]
        sql = _PREFIX.get() + sql
        with translating(self.alias, nowait=False), cursors.kept(connection) as cursor:
            cursor.execute(sql, params)
            return read_rows(cursor.cursor, sql)


_PREFIX: ContextVar[str] = ContextVar("lockkit_claims_statement_prefix", default="")


@contextlib.contextmanager
def bounded(prefix: str) -> Iterator[None]:
    """Run the claims statements of the block with ``prefix`` (the backend's ``statement_settings``) before each."""
    token = _PREFIX.set(prefix)
    try:
        yield
    finally:
        _PREFIX.reset(token)


def identical(values: Mapping[str, Any]) -> Hashable | None:
    """What makes two assignments identical for Django's compiler (see ``ClaimsSQL.update``); ``None``: not kept.

    Also the key under which ``lockkit.claims.inputs.assignments`` keeps its checks of identical assignments.
    """
    key: list[Hashable] = [ZONE_SETTINGS[0]]  # plain values are prepared against USE_TZ and TIME_ZONE
    expressions = False
    for name, value in values.items():
        # lockkit's own expression first: the cheapest test
        if _ZONELESS.get(id(value), _NOT_MARKED) is value:
            key.append((name, id(value)))
        elif type(value) in _PLAIN or (isinstance(value, Choices) and type(value.value) in _PLAIN):
            # A choices member (``TextChoices``, ``IntegerChoices``) holds a plain value it cannot change, and is
            # prepared from it (Django's ``Choices.__str__`` is ``str(value)``); any other enumeration may hold a
            # mutable value, or none that can be hashed.
            key.append((name, type(value), value))
        elif isinstance(value, BaseExpression | Combinable):
            key.append((name, id(value)))
            expressions = True
        else:
            return None
    if expressions:  # what a caller's expression compiles to may depend on the time zone (Trunc, Extract)
        key.append((settings.USE_TZ, timezone.get_current_timezone_name()))
    return tuple(key)


@functools.lru_cache(maxsize=64)
def _lease_end(clock: Expression, lease: float) -> BaseExpression:
    # The interval is a parameter: a duration is prepared the same in every time zone.
    return zoneless(clock + Value(timedelta(seconds=lease), output_field=DurationField()))
