"""``Claim``: the frozen value a worker holds for one claimed row, and presents to every later write.

Also ``stale_reason``: why a claim no longer holds its row, in words for ``StaleClaim``'s message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar

from lockkit.claims.mixin import Claimable

M = TypeVar("M", bound=Claimable)


@dataclass(frozen=True)
class Claim:
    """One claimed row: which row, the fencing token, and the lease, as the database recorded them.

    A ``Claim`` is plain data (picklable when its model is importable), so it can travel to another process;
    it stays valid only while the row still carries ``token`` and is claimed.

    Attributes:
        model: The ``Claimable`` model class of the row.
        pk: The row's primary key.
        token: The row's ``claim_token`` written by this claim.
        worker: The worker name the claim was made for.
        lease_expires_at: When the lease ends, by the database clock (aware when ``USE_TZ = True``).
        attempt: The row's ``attempts`` after this claim (1 for a first claim).
        alias: The database alias the row lives on.
        lease: The lease length in seconds this claim was made (or last renewed) with; ``heartbeat()`` reuses
            it.
    """

    model: type[Claimable]
    pk: Any
    token: int
    worker: str
    lease_expires_at: datetime
    attempt: int
    alias: str
    lease: float

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, model: type[Claimable], alias: str, lease: float) -> Claim:
        """Build the claim a claiming statement returned.

        Args:
            row: The claimed row's columns by name: ``pk``, ``claim_token``, ``claimed_by``,
                ``lease_expires_at``, ``attempts``.
            model: The ``Claimable`` model of the row.
            alias: The database alias the row lives on.
            lease: The lease in seconds the claim was made with.

        Returns:
            The ``Claim``.
        """
        return cls(
            model=model,
            pk=row["pk"],
            token=int(row["claim_token"]),
            worker=str(row["claimed_by"]),
            lease_expires_at=row["lease_expires_at"],
            attempt=int(row["attempts"]),
            alias=alias,
            lease=lease,
        )


class Claimed(NamedTuple, Generic[M]):
    """A row ``claim_next(..., fetch=True)`` claimed: the model instance (as the claim left it) and its claim.

    Unpack it: ``for job, claim in claim_next(..., fetch=True):``.

    Attributes:
        instance: The claimed row as a model instance, loaded from the claiming statement itself.
        claim: Its ``Claim``.
    """

    instance: M
    claim: Claim


def stale_reason(claim: Claim, row: tuple[int, str, bool | None] | None) -> str | None:
    """Say what happened to ``claim``'s row, or return ``None`` when the row still carries the claim, live.

    Args:
        claim: The claim that was used.
        row: The row as it is now: ``(claim_token, claimed_by, live)``, where ``live`` is ``None`` when the row is
            not claimed (``lease_expires_at`` is NULL), ``False`` when its lease has expired by the database
            clock, ``True`` otherwise; ``None`` when the row is gone.

    Returns:
        A clause such as ``"it is now claimed by worker 'b' with token 7"``, or ``None``.
    """
    if row is None:
        return "the row no longer exists"
    token, worker, live = row
    ours = token == claim.token and worker == claim.worker
    if live is None:
        # complete(), release() and reclaim_expired() all end a claim by clearing its lease: they look alike.
        ended = "this claim" if ours else f"the later claim of worker {worker!r} with token {token}"
        return (
            f"it is no longer claimed by anyone: {ended} was completed or released (or handed back by "
            "reclaim_expired)"
        )
    if not ours:
        expired = ", whose lease has expired" if live is False else ""
        return f"it is now claimed by worker {worker!r} with token {token}{expired}"
    if live is False:
        return "its lease expired by the database clock"
    return None


__all__ = ["Claim", "Claimed"]
