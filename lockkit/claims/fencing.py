"""Fenced writes: ``fenced(claim)``, and the one statement every later write of a claimed row runs.

``fenced(claim)`` is a locked scope whose writes commit only while the claim holds its row: database effects written
in it (and a ``complete()`` in it) commit together, once per job, even across a lease expiry and a reclaim; external
effects (e-mail, HTTP) stay at-least-once. ``fenced_update`` is the statement ``heartbeat()``, ``complete()`` and
``release()`` write with. See docs/claims.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections
from django.db.models import BooleanField, ExpressionWrapper, Q

from lockkit import events, signals
from lockkit._engine import outcome
from lockkit.claims import inputs, runner
from lockkit.claims.sql import claims_sql_for
from lockkit.claims.value import Claim, stale_reason
from lockkit.errors import ConnectionLost, StaleClaim
from lockkit.scopes import unlocked
from lockkit.scopes.blocks import locked
from lockkit.scopes.scope import LockScope


@contextmanager
def fenced(claim: Claim) -> Iterator[LockScope]:
    """Open a locked scope on the claim's alias that holds the job row and proves the claim is still current.

    On entry, inside ``lockkit.locked(claim.alias)``, the job row is locked (``SELECT ... FOR NO KEY UPDATE``;
    ``FOR UPDATE`` on MariaDB/MySQL; SQLite's ``BEGIN IMMEDIATE`` holds the database write lock) and checked:
    it must carry the claim's token and worker, and its lease must not have expired by the database clock.
    Otherwise ``StaleClaim`` is raised before the block runs, and nothing is written. While the block runs the
    row stays locked, so ``reclaim_expired()`` (``SKIP LOCKED``) cannot hand the job back and no other claim can
    take it: the block's writes, and a ``complete(claim, ...)`` called inside it, commit together in the scope's
    transaction, or not at all. Complete inside the block to make the job's database effects exactly-once. See
    https://www.postgresql.org/docs/current/explicit-locking.html#LOCKING-ROWS.

    Effects outside the database (e-mail, HTTP calls) cannot join the transaction: they are at-least-once. Give
    them the idempotency key ``(claim.pk, claim.token)``, or send them from ``scope.on_commit()``.

    Args:
        claim: The claim the block's effects are for.

    Yields:
        The ``LockScope`` (``scope.alias`` is the claim's alias; use its helpers, or the ORM with
        ``using=scope.alias``).

    Raises:
        TypeError, ValueError: ``claim`` is not a valid ``Claim``.
        StaleClaim: the row is gone, carries another claim, was completed/released, or the lease expired by the
            database clock; nothing was written.
        LockTimeout: another session held the row (e.g. a ``complete`` of the same claim) past the lock timeout.
        django.db.NotSupportedError: the database is not one lockkit.claims supports.
    """
    held = inputs.claim(claim)
    alias = held.alias
    statements = claims_sql_for(held.model, alias)
    current = ExpressionWrapper(Q(lease_expires_at__gt=statements.now()), output_field=BooleanField())
    pk = inputs.exact_pk(held.model, held.pk, "claim.pk")
    with locked(alias, no_key=connections[alias].features.has_select_for_no_key_update) as scope:
        row = (
            scope.lock(held.model._base_manager.using(alias).filter(pk=pk))
            .annotate(lockkit_current=current)
            .values_list("claim_token", "claimed_by", "lockkit_current")
            .first()
        )
        if row is not None:  # locked through values_list(): no instance for the unlocked-save check to see
            unlocked.record_row(alias, held.model, pk)
        reason = _stale_reason(held, row)
        if reason is not None:
            raise StaleClaim(
                f"{held.model.__name__} claim pk={held.pk!r} token={held.token} worker={held.worker!r} is no "
                f"longer current: {reason}; nothing was written",
                alias=alias,
                claims=(held,),
            )
        yield scope


def _stale_reason(claim: Claim, row: tuple[int, str, bool | None] | None) -> str | None:
    """Why ``row`` (token, worker, lease-not-expired) does not carry ``claim``, or ``None`` when it does."""
    return stale_reason(claim, row)


def fenced_update(
    claims: tuple[Claim, ...], values: dict[str, Any], lock_timeout: Any, *, doing: str
) -> dict[Any, Any]:
    """Write ``values`` to every claimed row in one statement if every claim is still live; else nothing.

    Live means the row still carries the claim's token and is claimed. Returns ``{pk: lease_expires_at}`` of
    the rows written. ``doing`` is the verb of the retry log lines, completed with the rows' name ("completing"
    -> "completing claimed tasks").

    Raises:
        StaleClaim: a claim is no longer live (nothing was written).
    """
    first = claims[0]
    model, alias = first.model, first.alias
    inputs.alias_for(alias, model._base_manager.all())
    statements = claims_sql_for(model, alias)
    pks = inputs.prepared_pks(claims, alias)
    tokens, workers = [c.token for c in claims], [c.worker for c in claims]
    resolving: list[ConnectionLost] = []
    described = f"{doing} claimed {runner.rows_of(model)}"

    def work() -> list[Any]:
        return statements.fenced_update(pks, tokens, workers, values)

    def resolve(message: Any, lost: ConnectionLost) -> list[Any]:
        # The reply was lost: once the session that sent it has ended, the same fenced statement says what
        # happened (written now: the first did not commit; stale with the row already ended as asked: it did).
        runner.await_session_end(alias, message, lost)
        resolving.append(lost)
        return runner.in_one_message(alias, lock_timeout, work, doing=described)

    rows = runner.in_one_message(alias, lock_timeout, work, resolve, doing=described)
    return judged(claims, pks, rows, values, resolving[0] if resolving else None)


def judged(
    claims: tuple[Claim, ...],
    pks: list[Any],
    rows: list[Any],
    values: dict[str, Any],
    lost: ConnectionLost | None,
) -> dict[Any, Any]:
    """What a fenced write's ``rows`` say: ``{pk: lease_expires_at}`` of the rows written, else ``StaleClaim``.

    ``lost``: an earlier statement's reply was lost (``rows`` are a later statement's, or none); claims no longer
    live but ended with ``values`` were then ended by the lost statement.

    Raises:
        StaleClaim: a claim no longer held its row (nothing was written).
        CommitOutcomeUnknown: after ``lost``, no claim is live and the rows do not carry ``values``.
    """
    model, alias = claims[0].model, claims[0].alias
    written = {row["pk"]: row["lease_expires_at"] for row in rows if row["written"]}
    if len(written) != len(claims):
        # The statement writes all rows or none, so nothing was written here.
        live = {row["pk"] for row in rows}
        stale = tuple(c for c, p in zip(claims, pks, strict=True) if p not in live) or claims
        holders, reasons, already_done = _now_holding(stale, values)
        if lost is not None and not live:
            # No claim is live any more: the lost statement may have ended them (all or none).
            if already_done and len(stale) == len(claims):
                return {c.pk: None for c in claims}  # the lost statement committed: the claims ended as asked
            raise outcome.unknown(alias, lost, what="a claims statement") from lost
        # A claim still live after the re-send: the lost statement (all rows or none) wrote nothing; stale.
        listing = "; ".join(
            f"pk={c.pk!r} token={c.token} worker={c.worker!r}: {reasons[c.pk]}" for c in stale
        )
        done = " (already ended with these values)" if already_done else ""
        error = StaleClaim(
            f"{len(stale)} of {len(claims)} {model.__name__} claim(s) no longer hold their row{done}: {listing}; "
            "nothing was written",
            alias=alias,
            claims=stale,
            holders=holders,
            already_done=already_done,
        )
        events.claims_event(signals.claim_stale, Claim, stale, error=error)
        raise error
    return written


def _now_holding(
    stale: tuple[Claim, ...], values: dict[str, Any]
) -> tuple[dict[Any, tuple[str, int] | None], dict[Any, str], bool]:
    """Who holds the stale claims' rows now, what happened to each (in words), and whether they hold ``values``.

    Read after the fenced statement found them stale (the error path only); plain values are compared, not
    expressions.
    """
    first = stale[0]
    plain = {
        name: value
        for name, value in values.items()
        if name != "lease_expires_at" and not hasattr(value, "resolve_expression")
    }
    fields = ["pk", "claim_token", "claimed_by", "lease_expires_at", *plain]
    found = first.model._base_manager.using(first.alias).filter(pk__in=[c.pk for c in stale]).values(*fields)
    # Keyed by the pk as the field makes it: a claim's pk may be a str where the row's is a UUID (MariaDB, SQLite).
    to_python = first.model._meta.pk.to_python
    rows = {to_python(row["pk"]): row for row in found}
    holders: dict[Any, tuple[str, int] | None] = {}
    reasons: dict[Any, str] = {}
    already_done = "lease_expires_at" in values and values["lease_expires_at"] is None
    for claim in stale:
        row = rows.get(to_python(claim.pk))
        if row is None or row["lease_expires_at"] is None:
            holders[claim.pk] = None
        else:
            holders[claim.pk] = (str(row["claimed_by"]), int(row["claim_token"]))
        now: tuple[int, str, bool | None] | None = None
        if row is not None:  # a claimed row's lease is not compared with the clock here: "claimed" is enough
            claimed = None if row["lease_expires_at"] is None else True
            now = (int(row["claim_token"]), str(row["claimed_by"]), claimed)
        reasons[claim.pk] = stale_reason(claim, now) or "it carries this claim again (it changed meanwhile)"
        already_done = already_done and (
            row is not None
            and row["lease_expires_at"] is None
            and row["claim_token"] == claim.token
            and row["claimed_by"] == claim.worker
            and all(_stored(first.model, name, value) == row[name] for name, value in plain.items())
        )
    return holders, reasons, already_done


def _stored(model: type[Any], name: str, value: Any) -> Any:
    """``value`` as the field reads it back (``5`` for a ``CharField`` is ``"5"``); itself when it cannot say."""
    try:
        return model._meta.get_field(name).to_python(value)
    except Exception:
        return value


__all__ = ["StaleClaim", "fenced"]
