"""Job claims: ``SKIP LOCKED`` claiming in short transactions, leases on the database clock, fencing tokens.

Import from here (``from lockkit.claims import claim_next``) once Django's app registry is ready (in models,
views, management commands, tasks): defining the ``Claimable`` model mixin needs it. Every function has an
awaitable twin named as Django's (``aclaim_next``, ``acomplete``...). See docs/claims.md.
"""

from __future__ import annotations

from lockkit.claims.api import (
    aclaim,
    aclaim_next,
    acomplete,
    acomplete_many,
    aheartbeat,
    aheld_by,
    areclaim_expired,
    arelease,
    arelease_many,
    claim,
    claim_next,
    complete,
    complete_many,
    heartbeat,
    held_by,
    reclaim_expired,
    release,
    release_many,
)
from lockkit.claims.beat import heartbeat_every
from lockkit.claims.fencing import fenced
from lockkit.claims.mixin import CLAIM_FIELDS, Claimable
from lockkit.claims.renewal import aheartbeat_worker, heartbeat_worker
from lockkit.claims.value import Claim, Claimed
from lockkit.claims.workerbeat import worker_heartbeat
from lockkit.errors import StaleClaim

__all__ = [
    "CLAIM_FIELDS",
    "Claim",
    "Claimable",
    "Claimed",
    "StaleClaim",
    "aclaim",
    "aclaim_next",
    "acomplete",
    "acomplete_many",
    "aheartbeat",
    "aheartbeat_worker",
    "aheld_by",
    "areclaim_expired",
    "arelease",
    "arelease_many",
    "claim",
    "claim_next",
    "complete",
    "complete_many",
    "fenced",
    "heartbeat",
    "heartbeat_every",
    "heartbeat_worker",
    "held_by",
    "reclaim_expired",
    "release",
    "release_many",
    "worker_heartbeat",
]
