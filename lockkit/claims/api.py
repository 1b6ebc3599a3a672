"""Claiming jobs and everything a worker does with a claim afterwards, on PostgreSQL.

Claims are made in short transactions that commit before the caller works on the job; every later write by the
worker is fenced by the claim's token. See docs/claims.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from django.db import models
from django.db.models import Case, F, Field, Q, QuerySet, Value, When
from django.db.models.expressions import BaseExpression

from lockkit.claims import checks, runner, sql
from lockkit.claims.mixin import Claimable
from lockkit.claims.value import Claim
from lockkit.errors import CommitOutcomeUnknown, StaleClaim
from lockkit.options import FROM_SETTINGS
from lockkit.scope import current_scope
from lockkit.validation import Duration

_PICKED = '"lockkit_picked"'
_ORDERED = '"lockkit_ordered"'
_GIVEN = '"lockkit_given"'
_LIVE = '"lockkit_live"'
_DONE = '"lockkit_done"'
_EXPIRED = '"lockkit_expired"'


def _returning(model: type[Claimable], alias: str) -> str:
    return ", ".join(
        [sql.pk_column(model, alias)]
        + [sql.column(model, alias, name) for name in ("claim_token", "lease_expires_at", "attempts")]
    )


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
    and failures are classified): the row is locked with ``SELECT ... FOR NO KEY UPDATE``, which re-checks the
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
        using: The database alias; default the queryset's or instance's database, else
            ``router.db_for_write``.

    Returns:
        The ``Claim``, or ``None`` when the row does not exist, is already claimed, or ``when`` does not hold.

    Raises:
        TypeError: a parameter has the wrong type, or the model does not use the ``Claimable`` mixin.
        ValueError: an unsaved instance, a non-positive lease, an empty worker name, an unknown field in
            ``set``.
        AliasMismatch: ``using`` differs from the database the queryset is bound to.
        django.db.NotSupportedError: the database is not PostgreSQL.
        MultipleObjectsReturned: the queryset matches more than one claimable row (nothing is claimed).
        LockTimeout: another session held the row longer than the lock timeout.
    """
    hint: models.Model | None = None
    if isinstance(target, models.Model):
        model = checks.claimable_model(type(target), "target")
        if target.pk is None:
            raise ValueError(f"target is an unsaved {model.__name__} instance: it has no row to claim")
        queryset: QuerySet[Any] = model._base_manager.filter(pk=target.pk)
        if target._state.db is not None:
            # The instance's row lives on its own database: a different using= would claim an unrelated row.
            queryset = queryset.using(target._state.db)
        hint = target
    elif isinstance(target, QuerySet):
        queryset = checks.queryset(target, "target")
        model = checks.claimable_model(queryset.model, "target")
    else:
        raise TypeError(
            f"target must be a saved Claimable instance or a QuerySet, not {type(target).__name__}"
        )
    name = checks.worker(worker)
    seconds = checks.lease(lease)
    condition = checks.condition(when)
    alias = checks.alias_for(using, queryset, hint)
    prefix, set_params = sql.update_prefix(
        model, alias, sql.claim_assignments(name, seconds, checks.assignments(model, set, "set"))
    )
    candidates = queryset.using(alias).filter(lease_expires_at__isnull=True)
    if condition is not None:
        candidates = candidates.filter(condition)
    statement = f"{prefix} WHERE {sql.pk_column(model, alias)} = %s RETURNING {_returning(model, alias)}"

    def work() -> tuple[Any, ...] | None:
        rows = list(current_scope().lock(candidates).only("pk").order_by()[:2])
        if not rows:
            return None
        if len(rows) > 1:
            raise model.MultipleObjectsReturned(
                f"target matches more than one claimable {model.__name__} row; claim one, or use claim_next()"
            )
        pk_value = sql.prepare_pks(model, alias, [rows[0].pk])[0][0]
        (row,), _ = sql.run(alias, statement, [*set_params, pk_value])
        return row

    row = runner.in_transaction(alias, lock_timeout, work)
    if row is None:
        return None
    return Claim(model, row[0], int(row[1]), name, row[2], int(row[3]), alias, seconds)


def claim_next(
    queryset: QuerySet[Any],
    *,
    worker: str,
    lease: Duration,
    limit: int = 1,
    set: dict[str, Any] | None = None,
    order_by: Sequence[str | BaseExpression] | None = None,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> list[Claim]:
    """Claim up to ``limit`` free rows of ``queryset`` without waiting on rows other sessions hold.

    One statement, one round trip: a ``MATERIALIZED`` CTE selects the free rows in order with ``LIMIT`` and
    ``FOR NO KEY UPDATE ... SKIP LOCKED`` (evaluated exactly once), and an ``UPDATE`` joined to it on the
    primary key writes the claims and returns them. The update is never ``WHERE pk IN (subquery with LIMIT)``,
    which a plan may re-evaluate and so claim more than ``limit`` rows. Outside a transaction the statement
    commits on its own before this returns. ``FOR NO KEY UPDATE`` leaves inserts of rows referencing the job
    unblocked. See https://www.postgresql.org/docs/current/sql-select.html#SQL-FOR-UPDATE-SHARE.

    Free means not claimed (``lease_expires_at IS NULL``); expired claims become free through
    ``reclaim_expired()``.

    Args:
        queryset: The candidate rows of a ``Claimable`` model (a queryset, manager or model class), e.g.
            ``Job.objects.filter(state="pending")``. Not sliced, not ``distinct()``.
        worker: The worker's name, stored in ``claimed_by`` (at most 255 characters).
        lease: Seconds (``int``/``float``) or a ``timedelta``, counted on the database clock.
        limit: The most rows to claim (at least 1).
        set: Fields to write with each claim, e.g. ``{"state": "running"}``.
        order_by: Field names or expressions deciding which rows are claimed first; default the queryset's
            ordering, else the primary key.
        using: The database alias; default the queryset's bound database, else ``router.db_for_write(model)``.

    Returns:
        The claims, in ``order_by`` order; an empty list when no free row is available right now.

    Raises:
        TypeError: a parameter has the wrong type, or the model does not use the ``Claimable`` mixin.
        ValueError: a non-positive ``lease`` or ``limit``, a sliced or distinct queryset, a bad ``set``.
        AliasMismatch: ``using`` differs from the database the queryset is bound to.
        django.db.NotSupportedError: the database is not PostgreSQL.
        LockTimeout, StatementTimeout: the connection's own ``lock_timeout``/``statement_timeout`` expired
            (row locks are never waited for; table locks, e.g. during a migration, can be).
    """
    candidates = checks.queryset(queryset)
    model = checks.claimable_model(candidates.model, "queryset")
    name = checks.worker(worker)
    seconds = checks.lease(lease)
    count = checks.positive_int(limit, "limit")
    ordering = checks.order(order_by)
    alias = checks.alias_for(using, candidates)
    prefix, set_params = sql.update_prefix(
        model, alias, sql.claim_assignments(name, seconds, checks.assignments(model, set, "set"))
    )
    candidates = candidates.using(alias).filter(lease_expires_at__isnull=True)
    if ordering is not None:
        candidates = candidates.order_by(*ordering)
    elif not candidates.ordered:
        candidates = candidates.order_by("pk")
    locking = sql.locking_select(candidates, alias, limit=count, skip_locked=True)
    if locking is None:
        return []
    select, select_params = locking
    pk = sql.pk_column(model, alias)
    statement = (
        f"WITH {_PICKED} (pk) AS MATERIALIZED ({select}), "
        f"{_ORDERED} (pk, position) AS MATERIALIZED (SELECT pk, row_number() OVER () FROM {_PICKED}) "
        f"{prefix} FROM {_ORDERED} WHERE {pk} = {_ORDERED}.pk "
        f"AND {sql.column(model, alias, 'lease_expires_at')} IS NULL "
        f"RETURNING {_returning(model, alias)}, {_ORDERED}.position"
    )
    rows, _ = runner.in_transaction(
        alias, lock_timeout, lambda: sql.run(alias, statement, [*select_params, *set_params])
    )
    rows.sort(key=lambda row: int(row[4]))
    return [Claim(model, row[0], int(row[1]), name, row[2], int(row[3]), alias, seconds) for row in rows]


def _fenced_update(claims: tuple[Claim, ...], values: dict[str, Any], lock_timeout: Any) -> dict[Any, Any]:
    """Write ``values`` to every claimed row in one statement if every claim is still live; else nothing.

    Live means the row still carries the claim's token and is claimed. The rows are locked (``FOR NO KEY
    UPDATE``, re-checked after any wait) in a materialized CTE; the data-modifying CTE updates them only when
    all are live; the outer query reports which were live. Returns ``{pk: lease_expires_at}`` of the rows
    written.

    Raises:
        StaleClaim: a claim is no longer live (nothing was written).
    """
    first = claims[0]
    model, alias = first.model, first.alias
    checks.alias_for(alias, model._base_manager.all())
    prefix, set_params = sql.update_prefix(model, alias, values)
    pks, pk_array = sql.prepare_pks(model, alias, [c.pk for c in claims])
    pk = sql.pk_column(model, alias)
    token = sql.column(model, alias, "claim_token")
    lease = sql.column(model, alias, "lease_expires_at")
    table = pk.rsplit(".", 1)[0]
    statement = (
        f"WITH {_GIVEN} (pk, token) AS (SELECT * FROM unnest(%s::{pk_array}, %s::bigint[])), "
        f"{_LIVE} (pk) AS MATERIALIZED (SELECT {pk} FROM {table} JOIN {_GIVEN} "
        f"ON {pk} = {_GIVEN}.pk AND {token} = {_GIVEN}.token WHERE {lease} IS NOT NULL "
        f"FOR NO KEY UPDATE OF {table}), "
        f"{_DONE} AS ({prefix} FROM {_LIVE} WHERE {pk} = {_LIVE}.pk "
        f"AND (SELECT count(*) FROM {_LIVE}) = %s RETURNING {pk} AS pk, {lease} AS lease) "
        f"SELECT {_LIVE}.pk, {_DONE}.pk IS NOT NULL, {_DONE}.lease FROM {_LIVE} LEFT JOIN {_DONE} "
        f"ON {_DONE}.pk = {_LIVE}.pk"
    )
    params = [pks, [c.token for c in claims], *set_params, len(claims)]
    rows, _ = runner.in_transaction(alias, lock_timeout, lambda: sql.run(alias, statement, params))
    written = {row[0]: row[2] for row in rows if row[1]}
    if len(written) != len(claims):
        live = {row[0] for row in rows}
        stale = tuple(c for c, p in zip(claims, pks, strict=True) if p not in live)
        holders, already_done = _now_holding(stale, values)
        listing = ", ".join(f"pk={c.pk!r} token={c.token} held by {holders.get(c.pk)}" for c in stale)
        done = " (already ended with these values)" if already_done else ""
        raise StaleClaim(
            f"{len(stale)} of {len(claims)} {model.__name__} claim(s) no longer hold their row{done} "
            f"(reclaimed, completed or released; a newer claim may own it): {listing}; nothing was written",
            alias=alias,
            claims=stale,
            holders=holders,
            already_done=already_done,
        )
    return written


def _now_holding(
    stale: tuple[Claim, ...], values: dict[str, Any]
) -> tuple[dict[Any, tuple[str, int] | None], bool]:
    """Who holds the stale claims' rows now, and whether each row already holds what ``values`` writes."""
    first = stale[0]
    plain = {
        name: value
        for name, value in values.items()
        if name != "lease_expires_at" and not hasattr(value, "resolve_expression")
    }
    fields = ["pk", "claim_token", "claimed_by", "lease_expires_at", *plain]
    rows = {
        row["pk"]: row
        for row in first.model._base_manager.using(first.alias)
        .filter(pk__in=[c.pk for c in stale])
        .values(*fields)
    }
    holders: dict[Any, tuple[str, int] | None] = {}
    already_done = "lease_expires_at" in values and values["lease_expires_at"] is None
    for claim in stale:
        row = rows.get(claim.pk)
        if row is None or row["lease_expires_at"] is None:
            holders[claim.pk] = None
        else:
            holders[claim.pk] = (str(row["claimed_by"]), int(row["claim_token"]))
        ended_here = (
            row is not None
            and row["lease_expires_at"] is None
            and row["claim_token"] == claim.token
            and all(row[name] == value for name, value in plain.items())
        )
        already_done = already_done and ended_here
    return holders, already_done


def heartbeat(
    claim: Claim,
    *,
    lease: Duration | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> Claim:
    """Renew a claim's lease from now, on the database clock, if the claim still holds its row.

    Call it periodically while working, well within the lease, so ``reclaim_expired`` leaves the job alone. A
    claim whose lease has lapsed but that no ``reclaim_expired`` has handed back is still live and is renewed:
    its token proves no one else was given the job.

    Safe to repeat: renewing a live claim twice only moves its lease again. So a heartbeat whose connection was
    lost, even at COMMIT with the outcome unknown, is sent again on a fresh connection; a worker keeps its job
    through a server restart or a pooler dropping its idle connection.

    Args:
        claim: The claim to renew.
        lease: The new lease in seconds (``int``/``float``) or a ``timedelta``; default the claim's ``lease``.
        lock_timeout: Seconds the row lock may be waited for; default ``settings.LOCKKIT["LOCK_TIMEOUT"]``.

    Returns:
        A new ``Claim`` with the new ``lease_expires_at`` (and ``lease``).

    Raises:
        TypeError, ValueError: ``claim`` is not a ``Claim``, or ``lease``/``lock_timeout`` is not a positive
            duration.
        StaleClaim: the row no longer carries this claim (nothing was written).
        LockTimeout: another session held the row longer than the lock timeout (nothing was written).
        ConnectionLost: the database stayed unreachable for the retry policy's ``reconnect_within``.
    """
    held = checks.claim(claim)
    seconds = held.lease if lease is None else checks.lease(lease)
    values = {"lease_expires_at": sql.lease_end(seconds)}
    try:
        written = _fenced_update((held,), values, lock_timeout)
    except CommitOutcomeUnknown:
        written = _fenced_update(
            (held,), values, lock_timeout
        )  # idempotent: renew again, on a new connection
    return replace(held, lease_expires_at=next(iter(written.values())), lease=seconds)


def complete(
    claim: Claim, *, set: dict[str, Any] | None = None, lock_timeout: Duration | None = FROM_SETTINGS
) -> None:
    """End a claim because the job is done, writing ``set`` (e.g. ``{"state": "done"}``) in one statement.

    Fenced: the write happens only if the row still carries the claim's token and is claimed. Call it inside
    your own ``transaction.atomic()`` together with the job's result writes to make them commit (or fail)
    together.

    Raises:
        TypeError, ValueError: ``claim`` is not a ``Claim``, or ``set`` names a field that cannot be set.
        StaleClaim: the row no longer carries this claim (nothing was written).
    """
    complete_many([checks.claim(claim)], set=set, lock_timeout=lock_timeout)


def complete_many(
    claims: Iterable[Claim],
    *,
    set: dict[str, Any] | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> None:
    """End many claims of one model and alias in one statement; all are written, or none (``StaleClaim``).

    Raises:
        TypeError, ValueError: not an iterable of ``Claim``, claims of different models/aliases or repeated
            rows, a bad ``set``.
        StaleClaim: at least one claim no longer holds its row; ``.claims`` lists those; nothing was written.
    """
    _end(checks.claims(claims), set, lock_timeout)


def release(
    claim: Claim, *, set: dict[str, Any] | None = None, lock_timeout: Duration | None = FROM_SETTINGS
) -> None:
    """Give a job back unfinished, writing ``set`` (e.g. ``{"state": "pending"}``) in one fenced statement.

    The row becomes free for ``claim``/``claim_next`` again (if it matches their querysets); ``attempts``
    keeps counting.

    Raises:
        TypeError, ValueError: ``claim`` is not a ``Claim``, or ``set`` names a field that cannot be set.
        StaleClaim: the row no longer carries this claim (nothing was written).
    """
    release_many([checks.claim(claim)], set=set, lock_timeout=lock_timeout)


def release_many(
    claims: Iterable[Claim],
    *,
    set: dict[str, Any] | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> None:
    """Release many claims of one model and alias in one statement; all are written, or none (``StaleClaim``).

    Raises:
        TypeError, ValueError, StaleClaim: as ``complete_many``.
    """
    _end(checks.claims(claims), set, lock_timeout)


def _end(claims: tuple[Claim, ...], values: dict[str, Any] | None, lock_timeout: Any) -> None:
    if not claims:
        if values is not None and not isinstance(values, dict):
            raise TypeError(f"set must be a dict of field names to values, not {type(values).__name__}")
        return  # no model to check the field names against, and nothing to write
    model = claims[0].model
    _fenced_update(
        claims, {"lease_expires_at": None, **checks.assignments(model, values, "set")}, lock_timeout
    )


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

    Returns:
        The number of rows changed (handed back plus exhausted).

    Raises:
        TypeError, ValueError: a wrong type, a non-positive ``max_attempts``, ``max_attempts`` without
            ``exhausted_set`` (or the reverse), a bad ``set``, a sliced or distinct queryset.
        AliasMismatch: ``using`` differs from the database the queryset is bound to.
        django.db.NotSupportedError: the database is not PostgreSQL.
    """
    candidates = checks.queryset(queryset)
    model = checks.claimable_model(candidates.model, "queryset")
    back = checks.assignments(model, set, "set")
    if (max_attempts is None) != (exhausted_set is None):
        raise ValueError("max_attempts and exhausted_set must be given together")
    values: dict[str, Any] = {"lease_expires_at": None}
    if max_attempts is not None:
        ceiling = checks.positive_int(max_attempts, "max_attempts")
        exhausted = checks.assignments(model, exhausted_set, "exhausted_set")
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
    alias = checks.alias_for(using, candidates)
    prefix, set_params = sql.update_prefix(model, alias, values)
    expired = candidates.using(alias).order_by().filter(lease_expires_at__lt=sql.StatementTimestamp())
    locking = sql.locking_select(expired, alias, limit=None, skip_locked=True)
    if locking is None:
        return 0
    select, select_params = locking
    statement = (
        f"WITH {_EXPIRED} (pk) AS MATERIALIZED ({select}) "
        f"{prefix} FROM {_EXPIRED} WHERE {sql.pk_column(model, alias)} = {_EXPIRED}.pk "
        f"AND {sql.column(model, alias, 'lease_expires_at')} < statement_timestamp()"
    )
    _, count = runner.in_transaction(
        alias, lock_timeout, lambda: sql.run(alias, statement, [*select_params, *set_params])
    )
    return count


def held_by(queryset: QuerySet[Any], *, worker: str, using: str | None = None) -> list[Claim]:
    """Return the unexpired claims ``worker`` holds on rows of ``queryset``, as working ``Claim`` objects.

    For a worker that lost track of its claims: a ``claim_next()`` whose reply was lost
    (``CommitOutcomeUnknown``), or a process restarted under the same worker name. Each returned claim carries
    the row's current token, so ``heartbeat()``/``complete()`` work with it, fenced as usual. Its ``lease`` is
    the time from the claim (``claimed_at``) to the lease's end; pass ``lease=`` to ``heartbeat()`` to choose.

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
    candidates = checks.queryset(queryset)
    model = checks.claimable_model(candidates.model, "queryset")
    name = checks.worker(worker)
    alias = checks.alias_for(using, candidates)
    held = (
        candidates.using(alias)
        .filter(claimed_by=name, lease_expires_at__gt=sql.StatementTimestamp())
        .order_by("pk")
        .values_list("pk", "claim_token", "lease_expires_at", "attempts", "claimed_at")
    )
    rows = runner.in_transaction(alias, FROM_SETTINGS, lambda: list(held))
    return [
        Claim(model, pk, int(token), name, expires, int(attempts), alias, (expires - claimed).total_seconds())
        for pk, token, expires, attempts, claimed in rows
    ]


def _expression(value: Any, field: Any) -> Any:
    return value if hasattr(value, "resolve_expression") else Value(value, output_field=field)
