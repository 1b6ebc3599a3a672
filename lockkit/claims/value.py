"""``Claim``: the frozen value a worker holds for one claimed row, and presents to every later write."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lockkit.claims.mixin import Claimable


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
