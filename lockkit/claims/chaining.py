"""Completing a claim and claiming the next rows together: on PostgreSQL one message, one transaction.

A worker that finishes a job and then claims the next sends ``BEGIN; <fenced completion>; <claim_next's
statement>; COMMIT`` as one simple-query message (the engine's ``message.carrying``): one round trip and one commit
instead of two. A stale completion matches no row and the claim still proceeds; the caller is told both. Private:
``lockkit.tasks``' worker uses it. See docs/tasks.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lockkit import events, signals
from lockkit._engine import message
from lockkit.claims import inputs
from lockkit.claims.api import NextClaims
from lockkit.claims.fencing import judged
from lockkit.claims.sql import claims_sql_for
from lockkit.claims.value import Claim, Claimed
from lockkit.errors import ConnectionLost, LockError, StaleClaim


@dataclass(frozen=True)
class Chained:
    """What ``complete_then_claim_next`` did.

    Attributes:
        claimed: What ``claim_next(..., fetch=True)`` returned.
        completed: The completion was written, in the claim's transaction.
        error: Why it was not: ``StaleClaim`` (the claim no longer held its row), or the
            ``CommitOutcomeUnknown`` of a lost reply the rows could not decide. ``completed`` false and no
            ``error``: the completion was not sent (another vendor, a caller's transaction, no claiming statement
            ran): nothing of it was written, the caller completes the claim itself.
    """

    claimed: list[Claimed[Any]]
    completed: bool = False
    error: LockError | None = None


def complete_then_claim_next(
    claim: Claim, written: dict[str, Any], claims: NextClaims, limit: int = 1
) -> Chained:
    """Complete ``claim`` writing ``written`` (``complete(claim, set=written)``), and ``claims.claim(limit)``.

    Outside a transaction on PostgreSQL (psycopg 3, client-side binding) both statements are one transaction sent
    as one message: both commit or neither does. A completion whose claim no longer holds its row writes nothing
    (``Chained.error`` is the ``StaleClaim``) while the claim proceeds. A lost reply is decided from the rows: the
    claims by ``claim_next``'s own resolution (rows claimed by the worker since the message was sent), the
    completion by the claim's row (unclaimed, carrying the claim's token and worker and ``written``).

    Args:
        claim: The claim to complete.
        written: Fields to write with the completion (as ``complete(set=...)``).
        claims: The next claims (``claim_next``'s arguments, checked once), built with ``fetch=True``.
        limit: The most rows to claim.

    Returns:
        The claims made and what became of the completion.

    Raises:
        TypeError, ValueError: a bad claim or ``written`` (before any SQL).
        django.db.DatabaseError: as ``claim_next``; the transaction rolled back: neither was written.
    """
    held = inputs.claim(claim)
    model, alias = held.model, held.alias
    values = {"lease_expires_at": None, **inputs.assignments(model, written, "set", alias)}
    (pk,) = pks = inputs.prepared_pks((held,), alias)
    statement = claims_sql_for(model, alias).fenced_one(pk, held.token, held.worker, values)
    if statement is None:
        return Chained(claims.claim(limit))
    with message.carrying(*statement) as carried:
        claimed = claims.claim(limit)
    if not carried.sends:
        return Chained(claimed)
    lost = None
    if carried.rows is None or carried.sends > 1:  # a reply was lost: the row says whether it committed
        lost = ConnectionLost(
            f"a reply to a message carrying a completion on {alias!r} was lost", alias=alias
        )
    try:
        judged((held,), pks, carried.rows or [], values, lost)
    except (StaleClaim, ConnectionLost) as error:
        return Chained(claimed, error=error)
    events.claims_event(signals.claim_completed, Claim, (held,))
    return Chained(claimed, completed=True)
