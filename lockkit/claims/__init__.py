"""Job claims: ``SKIP LOCKED`` claiming in short transactions, leases on the database clock, fencing tokens.

Import from here (``from lockkit.claims import claim_next``) once Django's app registry is ready (in models,
views, management commands, tasks): defining the ``Claimable`` model mixin needs it. See docs/claims.md.
"""

from __future__ import annotations

# Registers the MariaDB/MySQL and SQLite claims statements in lockkit.claims.sql.VENDORS.
from lockkit.claims import serial as _serial  # noqa: F401
from lockkit.claims.api import (
    claim,
    claim_next,
    complete,
    complete_many,
    heartbeat,
    reclaim_expired,
    release,
    release_many,
)
from lockkit.claims.beat import heartbeat_every
from lockkit.claims.fencing import fenced
from lockkit.claims.mixin import CLAIM_FIELDS, Claimable
from lockkit.claims.value import Claim, Claimed
from lockkit.errors import StaleClaim

__all__ = [
    "CLAIM_FIELDS",
    "Claim",
    "Claimable",
    "Claimed",
    "StaleClaim",
    "claim",
    "claim_next",
    "complete",
    "complete_many",
    "fenced",
    "heartbeat",
    "heartbeat_every",
    "reclaim_expired",
    "release",
    "release_many",
]
