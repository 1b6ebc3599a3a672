"""The worker's claims on task rows: claiming ready tasks and tasks whose lease expired, in one statement.

Built on lockkit.claims' ``claim_next(..., expired=True)``; the worker's heartbeat is ``lockkit.claims``'
``heartbeat_every(queryset, worker=...)`` itself (its ``holds()`` refuses to answer from a beat the worker slept
through).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from lockkit.claims import Claimed, claim_next


def claim_ready(
    candidates: QuerySet[Any],
    *,
    worker: str,
    lease: float,
    limit: int,
    values: dict[str, Any],
    order_by: list[Any],
) -> list[Claimed[Any]]:
    """Claim up to ``limit`` rows of ``candidates``: free ones, and those whose lease expired (one statement).

    Raises:
        django.db.DatabaseError: as ``lockkit.claims.claim_next``.
    """
    return claim_next(
        candidates,
        worker=worker,
        lease=lease,
        limit=limit,
        set=values,
        order_by=order_by,
        expired=True,
        fetch=True,
    )
