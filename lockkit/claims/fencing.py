"""``fenced(claim)``: a locked scope whose writes commit only while the claim still holds its row.

Database effects written in the block (and a ``complete()`` in it) commit together, once per job, even across a
lease expiry and a reclaim; external effects (e-mail, HTTP) stay at-least-once. See docs/claims.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections
from django.db.models import BooleanField, ExpressionWrapper, Q

from lockkit.claims import inputs
from lockkit.claims.sql import claims_sql_for
from lockkit.claims.value import Claim, stale_reason
from lockkit.errors import StaleClaim
from lockkit.scopes import unlocked
from lockkit.scopes.scope import LockScope, locked


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
