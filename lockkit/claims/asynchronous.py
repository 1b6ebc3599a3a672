"""Awaitable forms of the claims functions a worker needs (``aclaim_next``, ``acomplete``...), named as Django's.

Each runs its synchronous twin whole on one thread through ``asgiref.sync.sync_to_async(thread_sensitive=True)``
(``lockkit.aio.awaitable``), with the same arguments, result, errors and signals.
"""

from __future__ import annotations

from lockkit.aio import awaitable
from lockkit.claims.signalled import (
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

aclaim = awaitable(claim)
aclaim_next = awaitable(claim_next)
aheartbeat = awaitable(heartbeat)
acomplete = awaitable(complete)
acomplete_many = awaitable(complete_many)
arelease = awaitable(release)
arelease_many = awaitable(release_many)
areclaim_expired = awaitable(reclaim_expired)
aheld_by = awaitable(held_by)

__all__ = [
    "aclaim",
    "aclaim_next",
    "acomplete",
    "acomplete_many",
    "aheartbeat",
    "aheld_by",
    "areclaim_expired",
    "arelease",
    "arelease_many",
]
