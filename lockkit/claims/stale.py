"""Why a claim no longer holds its row, in words for ``StaleClaim``'s message (``fenced()`` and the fenced writes)."""

from __future__ import annotations

from lockkit.claims.value import Claim


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


__all__ = ["stale_reason"]
