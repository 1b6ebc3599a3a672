"""Claiming jobs, handing expired claims back, and finding a worker's claims (PostgreSQL, MariaDB/MySQL, SQLite).

Claims are made in short transactions that commit before the caller works on the job; every later write by the
worker is fenced by the claim's token (``heartbeats.py``, ``ending.py``, ``fencing.py``). Each function sends its
``lockkit.signals`` claim signal where the work is done (only when the signal has receivers), and has its awaitable
twin right after it (``aclaim_next``...), run whole on one thread by ``lockkit.aio.awaitable``. See docs/claims.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal, overload

from django.db import connections, models
from django.db.models import Case, F, Field, Q, QuerySet, Value, When
from django.db.models.expressions import BaseExpression

from lockkit import events, signals
from lockkit._engine import outcome
from lockkit.aio import awaitable
from lockkit.backends.sql.rows import instances
from lockkit.claims import inputs, runner
from lockkit.claims.sql import claims_sql_for
from lockkit.claims.sql.base import CLAIM_COLUMNS
from lockkit.claims.value import Claim, Claimed
from lockkit.errors import ConnectionLost
from lockkit.scopes.options import FROM_SETTINGS
from lockkit.scopes.stack import current_scope
from lockkit.validation import Duration, flag


def claim(
    target: models.Model | QuerySet[Any],
    *,
    worker: str,
    lease: Duration,
    when: Q | None = None,
    set: dict[str, Any] | None = None,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> Claim | None:
    """Claim one specific row if it is free and ``when`` holds, waiting for its lock within the lock timeout.

    Runs in ``lockkit.locked(alias, no_key=True)`` (so ``settings.LOCKKIT["LOCK_TIMEOUT"]`` bounds the wait
    and failures are classified): the row is locked with ``SELECT ... FOR NO KEY UPDATE`` (``FOR UPDATE`` on
    MariaDB/MySQL; on SQLite the scope's ``BEGIN IMMEDIATE`` holds the database write lock), which re-checks the
    filters, "not claimed" and ``when`` on the row's latest version after any wait, then updated. The
    transaction commits before this returns (unless the caller's own ``atomic()`` is open on the alias; then
    the claim commits with it). See
    https://www.postgresql.org/docs/current/transaction-iso.html#XACT-READ-COMMITTED.

    Args:
        target: A saved instance of a ``Claimable`` model, or a queryset of one matching at most one claimable
            row.
        worker: The worker's name, stored in ``claimed_by`` (at most 255 characters).
        lease: Seconds (``int``/``float``) or a ``timedelta`` the claim lasts before ``reclaim_expired`` may
            hand the row back, counted on the database clock.
        when: A ``Q`` the locked row must still satisfy (e.g. ``Q(state="pending")``); ``None`` for no
            condition.
        set: Fields to write with the claim, e.g. ``{"state": "running"}`` (values or expressions).
        using: The database alias. Default for an instance: ``router.db_for_write(type(target),
            instance=target)``, as ``Model.save()`` resolves it (an instance read from a replica is claimed on
            the primary; without a router, the database it was read from); an explicit ``using`` must name
            that same alias. Default for a queryset: its bound database, else ``router.db_for_write(model)``.
        lock_timeout: Seconds (or a ``timedelta``) a lock may be waited for; default
            ``settings.LOCKKIT["LOCK_TIMEOUT"]``; ``None`` leaves the connection's own setting.

    Returns:
        The ``Claim``, or ``None`` when the row does not exist, is already claimed, or ``when`` does not hold.

    Raises:
        TypeError: a parameter has the wrong type, or the model does not use the ``Claimable`` mixin or has a
            ``CompositePrimaryKey``.
        ValueError: an unsaved instance, a non-positive lease, an empty or unstorable worker name, an unknown
            field in ``set``/``when``, a ``set`` value its column cannot store or an aggregate or window function
            in it, a queryset that already carries ``select_for_update()`` (claims lock the rows themselves) or
            uses a window function.
        AliasMismatch: ``using`` differs from the database the queryset is bound to, or from the instance's
            write database (the message names both and the fix).
        django.db.NotSupportedError: the database is not PostgreSQL, MariaDB 10.6+/MySQL 8 or SQLite 3.35+.
        MultipleObjectsReturned: the queryset matches more than one claimable row (nothing is claimed).
        LockTimeout: another session held the row longer than the lock timeout.
    """
    hint: models.Model | None = None
    if isinstance(target, models.Model):
        model = inputs.claimable_model(type(target), "target")
        if target.pk is None:
            raise ValueError(f"target is an unsaved {model.__name__} instance: it has no row to claim")
        queryset: QuerySet[Any] = model._base_manager.filter(pk=target.pk)
        hint = target
    elif isinstance(target, QuerySet):
        queryset = inputs.queryset(target, "target")
        model = inputs.claimable_model(queryset.model, "target")
    else:
        raise TypeError(
            f"target must be a saved Claimable instance or a QuerySet, not {type(target).__name__}"
        )
    name = inputs.worker(worker)
    seconds = inputs.lease(lease)
    alias = inputs.alias_for(using, queryset, hint)
    statements = claims_sql_for(model, alias)
    values = statements.claim_assignments(name, seconds, inputs.assignments(model, set, "set", alias))
    candidates = inputs.condition(when, queryset.using(alias).filter(lease_expires_at__isnull=True))

    def work() -> Any:
        rows = list(current_scope().lock(candidates).only("pk").order_by()[:2])
        if not rows:
            return None
        if len(rows) > 1:
            raise model.MultipleObjectsReturned(
                f"target matches more than one claimable {model.__name__} row; claim one, or use claim_next()"
            )
        return statements.claim_row(rows[0].pk, values)

    row = runner.in_transaction(
        alias, lock_timeout, work, doing=f"claiming one of the {runner.rows_of(model)}"
    )
    if row is None:
        return None
    made = Claim.from_row(row, model=model, alias=alias, lease=seconds)
    _made([made])
    return made


aclaim = awaitable(claim)


def _made(claims: list[Claim]) -> None:
    """Send ``claim_made`` for the claims one call made (none: nothing to say)."""
    if claims and signals.claim_made.receivers:
        events.claims_event(signals.claim_made, Claim, claims, worker=claims[0].worker)


@overload
def claim_next(
    queryset: QuerySet[Any],
    *,
    worker: str,
    lease: Duration,
    limit: int = 1,
    set: dict[str, Any] | None = None,
    order_by: Sequence[str | BaseExpression | F] | None = None,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
    fetch: Literal[False] = False,
    expired: bool = False,
) -> list[Claim]: ...
@overload
def claim_next(
    queryset: QuerySet[Any],
    *,
    worker: str,
    lease: Duration,
    limit: int = 1,
    set: dict[str, Any] | None = None,
    order_by: Sequence[str | BaseExpression | F] | None = None,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
    fetch: Literal[True],
    expired: bool = False,
) -> list[Claimed[Any]]: ...
def claim_next(
    queryset: QuerySet[Any],
    *,
    worker: str,
    lease: Duration,
    limit: int = 1,
    set: dict[str, Any] | None = None,
    order_by: Sequence[str | BaseExpression | F] | None = None,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
    fetch: bool = False,
    expired: bool = False,
) -> list[Claim] | list[Claimed[Any]]:
    """Claim up to ``limit`` free rows of ``queryset`` without waiting on rows other sessions hold.

    On PostgreSQL, one statement, one round trip: a ``MATERIALIZED`` CTE selects the free rows in order with ``LIMIT`` and
    ``FOR NO KEY UPDATE ... SKIP LOCKED`` (evaluated exactly once), and an ``UPDATE`` joined to it on the
    primary key writes the claims and returns them. The update is never ``WHERE pk IN (subquery with LIMIT)``,
    which a plan may re-evaluate and so claim more than ``limit`` rows. With ``limit=1`` the pick is a scalar
    subquery, ``UPDATE ... WHERE pk = (SELECT ... LIMIT 1 ... SKIP LOCKED)``, which PostgreSQL runs once.
    Outside a transaction the statement commits on its own before this returns. ``FOR NO KEY UPDATE`` leaves inserts of rows referencing the job
    unblocked. See https://www.postgresql.org/docs/current/sql-select.html#SQL-FOR-UPDATE-SHARE. On
    MariaDB/MySQL, one short transaction: ``SELECT ... LIMIT n FOR UPDATE SKIP LOCKED``, then an ``UPDATE`` of
    those primary keys and a ``SELECT`` of the claims (no ``UPDATE ... RETURNING`` there). On SQLite, a
    ``BEGIN IMMEDIATE`` transaction (one writer at a time; waiting for the write lock obeys the lock timeout)
    picks the rows, then ``UPDATE ... RETURNING`` claims them.

    Free means not claimed (``lease_expires_at IS NULL``); expired claims become free through
    ``reclaim_expired()``, or, with ``expired=True``, are claimable here directly: a row whose lease has ended
    (``lease_expires_at <=`` the database clock) is picked in the same statement as the free rows, in the same
    order, under the same ``limit`` and ``SKIP LOCKED``, and re-checked on the locked row. Claiming it is a claim
    like any other: a new token (the previous holder's ``complete()``/``heartbeat()`` raise ``StaleClaim``) and
    one more attempt, so a worker that uses it needs no reaper.

    Args:
        queryset: The candidate rows of a ``Claimable`` model (a queryset, manager or model class), e.g.
            ``Job.objects.filter(state="pending")``. Not sliced, not ``distinct()``.
        worker: The worker's name, stored in ``claimed_by`` (at most 255 characters).
        lease: Seconds (``int``/``float``) or a ``timedelta``, counted on the database clock.
        limit: The most rows to claim (at least 1).
        set: Fields to write with each claim, e.g. ``{"state": "running"}``.
        order_by: Field names or expressions deciding which rows are claimed first, as ``QuerySet.order_by()``
            takes them (``"-priority"``, ``F("priority").desc(nulls_last=True)``, ``Lower("name")``,
            ``OrderBy``; not aggregates or window functions); default the queryset's
            ordering, else the primary key.
        using: The database alias; default the queryset's bound database, else ``router.db_for_write(model)``.
        fetch: Also return the claimed rows as model instances, read by the claiming statement itself
            (``RETURNING`` on PostgreSQL and SQLite: no extra round trip; MariaDB reads them back in the same
            transaction).
        lock_timeout: Seconds (or a ``timedelta``) a lock may be waited for; default
            ``settings.LOCKKIT["LOCK_TIMEOUT"]``; ``None`` leaves the connection's own setting.
        expired: Also claim rows whose lease has expired by the database clock (not only free rows); their
            ``attempts`` grows by one as for any claim (a job that killed its worker counts that attempt).

    Returns:
        The claims, in ``order_by`` order; an empty list when no free row is available right now. With
        ``fetch=True``, ``Claimed(instance, claim)`` pairs instead (``for job, claim in ...``), each instance as
        the claim left the row.

    Raises:
        TypeError: a parameter has the wrong type (``expired`` and ``fetch`` must be ``bool``), or the model does
            not use the ``Claimable`` mixin or has a ``CompositePrimaryKey``.
        ValueError: a non-positive ``lease`` or ``limit``, an empty or unstorable worker name, a sliced or
            distinct queryset, one that already carries ``select_for_update()`` or uses a window function, a bad
            ``set`` (an aggregate or window function in it too), an ``order_by`` naming an unknown field or using
            an aggregate or window function.
        AliasMismatch: ``using`` differs from the database the queryset is bound to.
        django.db.NotSupportedError: the database is not PostgreSQL, MariaDB 10.6+/MySQL 8 or SQLite 3.35+.
        LockTimeout, StatementTimeout: the connection's own ``lock_timeout``/``statement_timeout`` expired
            (row locks are never waited for; table locks, e.g. during a migration, can be); on SQLite, the
            database write lock stayed busy past the lock timeout (try again).
    """
    count = inputs.positive_int(limit, "limit")
    claims = NextClaims(
        queryset, worker=worker, lease=lease, set=set, order_by=order_by, using=using,
        lock_timeout=lock_timeout, fetch=fetch, expired=expired,
    )  # fmt: skip
    return claims.claim(count)


class NextClaims:
    """A ``claim_next`` call with its arguments checked once, to be made again and again (``claim(limit)``).

    Private: ``lockkit.tasks``' worker claims with the same arguments for its whole life, and checks them once.
    Built with ``claim_next``'s arguments but ``limit``, which each ``claim()`` takes; it sends nothing.

    Raises:
        As ``claim_next``, for its arguments (before any SQL).
    """

    def __init__(
        self,
        queryset: QuerySet[Any],
        *,
        worker: str,
        lease: Duration,
        set: dict[str, Any] | None = None,
        order_by: Sequence[str | BaseExpression | F] | None = None,
        using: str | None = None,
        lock_timeout: Duration | None = FROM_SETTINGS,
        fetch: bool = False,
        expired: bool = False,
    ) -> None:
        """Check the arguments (no SQL)."""
        candidates = inputs.queryset(queryset)
        self.model = model = inputs.claimable_model(candidates.model, "queryset")
        self.worker = inputs.worker(worker)
        self.lease = inputs.lease(lease)
        self.expired = lapsed = flag(expired, "expired")
        self.alias = alias = inputs.alias_for(using, candidates)
        self.lock_timeout = lock_timeout
        self.statements = statements = claims_sql_for(model, alias)
        self.values = statements.claim_assignments(
            self.worker, self.lease, inputs.assignments(model, set, "set", alias)
        )
        self.fields = model._meta.concrete_fields if flag(fetch, "fetch") else ()
        self.keys = statements.fetched_keys(self.fields)  # where each field is in a claimed row

        def ordered() -> QuerySet[Any]:  # built only where the SELECT is compiled (not kept, or a lost reply)
            return inputs.order(
                order_by, candidates.using(alias).filter(statements.claimable(expired=lapsed))
            )

        self.ordered = ordered
        # The caller's own queryset object (not one built here from a manager or a model): its SELECT is kept.
        # order_by is validated when the SELECT is compiled, so only a None or a list/tuple order_by is ever a key.
        keyable = order_by is None or isinstance(order_by, list | tuple)
        self.reuse = (
            (queryset, (None if order_by is None else tuple(order_by), lapsed))
            if candidates is queryset and keyable
            else None
        )

    def claim(self, limit: int) -> list[Any]:
        """Claim up to ``limit`` rows (a positive ``int``), as ``claim_next`` with the arguments given at building.

        Returns:
            ``Claim`` objects, or ``Claimed`` pairs when built with ``fetch=True``.

        Raises:
            As ``claim_next``.
        """
        model, alias, statements, ordered = self.model, self.alias, self.statements, self.ordered
        reuse = self.reuse
        # The same (kept) SELECT the claim uses: compiled once per queryset object, not once more per call.
        if statements.picked_pks(ordered, limit, reuse) is None:
            return []  # no row can match (.none(), pk__in=[]): no transaction either
        resolved: list[bool] = []

        def work() -> list[Any]:
            return statements.claim_next(
                ordered, limit, self.values, self.fields, reuse=reuse, expired=self.expired
            )

        def found(message: Any, lost: ConnectionLost) -> list[Any]:
            resolved.append(True)
            ordering = ordered().query.order_by
            return _claimed_by_lost_call(model, alias, self.worker, limit, message, lost, ordering)

        doing = f"claiming {runner.rows_of(model)}"

        def resolve(message: Any, lost: ConnectionLost) -> list[Any]:
            # The claims the lost call made; none means it changed nothing, and it is tried once more.
            return found(message, lost) or runner.in_one_message(
                alias, self.lock_timeout, work, found, doing=doing
            )

        rows = runner.in_one_message(alias, self.lock_timeout, work, resolve, doing=doing)
        claims = [Claim.from_row(row, model=model, alias=alias, lease=self.lease) for row in rows]
        _made(claims)
        fields = self.fields
        if not fields:
            return claims
        if resolved:  # read back by pk: the claiming statement's own columns were lost with its reply
            by_pk = model._base_manager.using(alias).in_bulk([c.pk for c in claims])
            return [Claimed(by_pk[c.pk], c) for c in claims]  # in the order the claims were found in
        loaded = instances(model, alias, rows, fields, self.keys)
        return [Claimed(instance, c) for instance, c in zip(loaded, claims, strict=True)]


aclaim_next = awaitable(claim_next)


def _claimed_by_lost_call(
    model: type[Any],
    alias: str,
    worker: str,
    limit: int,
    message: Any,
    lost: ConnectionLost,
    ordering: Sequence[Any] = (),
) -> list[Any]:
    """The claims a ``claim_next`` whose reply was lost made, read from the rows once its session ended.

    A claim's ``claimed_at`` is the database clock when the server received the claiming message (one value for
    every row of one statement), so the call's claims are the rows claimed by ``worker`` (still claimed) since the
    server's time when the message was sent, bounded from below by the server's clock now less the time since
    sending (measured here). Claims made under the same worker name by another caller in that moment would be
    counted too: more than ``limit`` found, or claims of more than one statement, and the outcome is unknown. They
    come back in the call's ``ordering``.

    Raises:
        CommitOutcomeUnknown: the session did not end in time, or the claims found cannot all be the call's.
    """
    runner.await_session_end(alias, message, lost)
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        (server_now,) = cursor.fetchone()
    since = server_now - timedelta(seconds=time.monotonic() - message.sent_at)
    rows = list(
        model._base_manager.using(alias)
        .filter(claimed_by=worker, lease_expires_at__isnull=False, claimed_at__gte=since)
        .order_by(*ordering, "pk")
        .values(*CLAIM_COLUMNS, "claimed_at")
    )
    if len(rows) > limit or len({row["claimed_at"] for row in rows}) > 1:
        raise outcome.unknown(alias, lost, what="a claims statement") from lost
    return rows


def reclaim_expired(
    queryset: QuerySet[Any],
    *,
    set: dict[str, Any] | None = None,
    max_attempts: int | None = None,
    exhausted_set: dict[str, Any] | None = None,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> int:
    """Hand back the rows of ``queryset`` whose lease has expired, by the database clock.

    One statement: a ``MATERIALIZED`` CTE locks the expired rows (``FOR NO KEY UPDATE SKIP LOCKED``: a row
    being renewed or completed right now is left for the next run), and the ``UPDATE`` joined to it re-checks
    ``lease_expires_at < statement_timestamp()`` on the row it changes, so a claim renewed or completed
    meanwhile is left alone. Each handed-back row is unclaimed (``lease_expires_at = NULL``) and gets ``set``
    (e.g. ``{"state": "pending"}``); a row whose ``attempts`` reached ``max_attempts`` gets ``exhausted_set``
    instead (e.g. ``{"state": "failed"}``). Its old claim's token no longer works (``StaleClaim``). See
    https://www.postgresql.org/docs/current/sql-update.html.

    Args:
        queryset: The rows to consider (a queryset, manager or model class of a ``Claimable`` model).
        set: Fields to write on rows handed back.
        max_attempts: With ``exhausted_set``: rows claimed this many times or more are not handed back but get
            ``exhausted_set``.
        exhausted_set: Fields to write on exhausted rows; required with ``max_attempts``.
        using: The database alias; default the queryset's bound database, else ``router.db_for_write(model)``.
        lock_timeout: Seconds (or a ``timedelta``) a lock may be waited for; default
            ``settings.LOCKKIT["LOCK_TIMEOUT"]``; ``None`` leaves the connection's own setting.

    Returns:
        The number of rows changed (handed back plus exhausted). After a lost reply (resolved by running the
        statement again, which is harmless), the rows the lost statement itself handed back are not counted.

    Raises:
        TypeError, ValueError: a wrong type, a non-positive ``max_attempts``, ``max_attempts`` without
            ``exhausted_set`` (or the reverse), a bad ``set``/``exhausted_set``, a sliced or distinct queryset
            or one that already carries ``select_for_update()``.
        AliasMismatch: ``using`` differs from the database the queryset is bound to.
        django.db.NotSupportedError: the database is not PostgreSQL, MariaDB 10.6+/MySQL 8 or SQLite 3.35+.
    """
    model, alias, pks = _reclaim(queryset, set, max_attempts, exhausted_set, using, lock_timeout)
    if pks and signals.claim_reclaimed.receivers:
        events.send(signals.claim_reclaimed, Claim, model=model, alias=alias, count=len(pks))
    return len(pks)


areclaim_expired = awaitable(reclaim_expired)


def reclaim_expired_pks(
    queryset: QuerySet[Any],
    *,
    set: dict[str, Any] | None = None,
    max_attempts: int | None = None,
    exhausted_set: dict[str, Any] | None = None,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> list[Any]:
    """``reclaim_expired()``, returning the primary keys of the rows changed, ascending (for the reaper's log).

    Raises:
        As ``reclaim_expired()``.
    """
    return sorted(_reclaim(queryset, set, max_attempts, exhausted_set, using, lock_timeout)[2])


def _reclaim(
    queryset: QuerySet[Any],
    set: dict[str, Any] | None,
    max_attempts: int | None,
    exhausted_set: dict[str, Any] | None,
    using: str | None,
    lock_timeout: Duration | None,
) -> tuple[type[Any], str, list[Any]]:
    """The one implementation of ``reclaim_expired``: the model, the alias and the primary keys changed."""
    candidates = inputs.queryset(queryset)
    model = inputs.claimable_model(candidates.model, "queryset")
    alias = inputs.alias_for(using, candidates)
    back = inputs.assignments(model, set, "set", alias)
    if (max_attempts is None) != (exhausted_set is None):
        raise ValueError("max_attempts and exhausted_set must be given together")
    values: dict[str, Any] = {"lease_expires_at": None}
    if max_attempts is not None:
        ceiling = inputs.positive_int(max_attempts, "max_attempts")
        exhausted = inputs.assignments(model, exhausted_set, "exhausted_set", alias)
        for field_name in {**back, **exhausted}:
            field = model._meta.get_field(field_name)
            assert isinstance(field, Field)
            values[field_name] = Case(
                When(
                    attempts__gte=ceiling, then=_expression(exhausted.get(field_name, F(field_name)), field)
                ),
                default=_expression(back.get(field_name, F(field_name)), field),
                output_field=field,
            )
    else:
        values.update(back)
    statements = claims_sql_for(model, alias)
    expired = candidates.using(alias)
    if statements.select_pks(expired, limit=None, skip_locked=True) is None:
        return model, alias, []  # no row can match: no transaction either

    doing = f"handing back expired claims on {runner.rows_of(model)}"

    def work() -> list[Any]:
        return statements.reclaim_expired(expired, values)

    def resolve(message: Any, lost: ConnectionLost) -> list[Any]:
        # Handing back expired rows again is harmless: what the lost statement handed back is not counted.
        runner.await_session_end(alias, message, lost)
        return runner.in_one_message(alias, lock_timeout, work, doing=doing)

    return model, alias, runner.in_one_message(alias, lock_timeout, work, resolve, doing=doing)


def held_by(queryset: QuerySet[Any], *, worker: str, using: str | None = None) -> list[Claim]:
    """Return the unexpired claims ``worker`` holds on rows of ``queryset``, as working ``Claim`` objects.

    For a worker that lost track of its claims: a ``claim_next()`` whose reply was lost
    (``CommitOutcomeUnknown``), or a process restarted under the same worker name. Each returned claim carries
    the row's current token, so ``heartbeat()``/``complete()`` work with it, fenced as usual. Its ``lease`` is
    the time from the claim (``claimed_at``) to the lease's end; pass ``lease=`` to ``heartbeat()`` to choose.

    Nothing is written and no attempt is counted: running a returned claim's job runs the same attempt again. That
    is right after a lost reply (the claim was counted, the job not started); after a restart the job may be what
    killed the process, so give such claims back (``release_many(held_by(...), set=...)``) and claim again, which
    counts, or let their leases expire for ``claim_next(expired=True)``. See docs/claims.md#a-worker.

    Args:
        queryset: The rows to look at (a queryset, manager or model class of a ``Claimable`` model).
        worker: The worker name the claims were made for.
        using: The database alias; default the queryset's bound database, else ``router.db_for_write(model)``.

    Returns:
        The claims, in primary-key order; empty when the worker holds none.

    Raises:
        TypeError, ValueError: a wrong type, an empty worker name, a sliced or distinct queryset.
        AliasMismatch: ``using`` differs from the database the queryset is bound to.
        django.db.NotSupportedError: the database is not PostgreSQL.
        ConnectionLost: the database stayed unreachable for the retry policy's ``reconnect_within``.
    """
    candidates = inputs.queryset(queryset)
    model = inputs.claimable_model(candidates.model, "queryset")
    name = inputs.worker(worker)
    alias = inputs.alias_for(using, candidates)
    now = claims_sql_for(model, alias).now()
    held = (
        candidates.using(alias)
        .filter(claimed_by=name, lease_expires_at__gt=now)
        .order_by("pk")
        .values("pk", "claim_token", "claimed_by", "lease_expires_at", "attempts", "claimed_at")
    )
    doing = f"reading the worker's claims on {runner.rows_of(model)}"
    rows = runner.in_transaction(alias, FROM_SETTINGS, lambda: list(held), doing=doing)
    return [
        Claim.from_row(
            row, model=model, alias=alias, lease=(row["lease_expires_at"] - row["claimed_at"]).total_seconds()
        )
        for row in rows
    ]


aheld_by = awaitable(held_by)


def _expression(value: Any, field: Any) -> Any:
    return value if hasattr(value, "resolve_expression") else Value(value, output_field=field)


__all__ = [
    "aclaim",
    "aclaim_next",
    "aheld_by",
    "areclaim_expired",
    "claim",
    "claim_next",
    "held_by",
    "reclaim_expired",
]
