"""Ending claims: ``complete()`` when the job is done, ``release()`` to give it back, one or many per statement.

Each write is fenced by the claims' tokens (``StaleClaim`` and no write otherwise), sends its signal where the work
is done, and has its awaitable twin right after it. See docs/claims.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import F

from lockkit import events, signals
from lockkit.aio import awaitable
from lockkit.claims import inputs
from lockkit.claims.fencing import fenced_update
from lockkit.claims.value import Claim
from lockkit.scopes.options import FROM_SETTINGS
from lockkit.validation import Duration


def complete(
    claim: Claim, *, set: dict[str, Any] | None = None, lock_timeout: Duration | None = FROM_SETTINGS
) -> None:
    """End a claim because the job is done, writing ``set`` (e.g. ``{"state": "done"}``) in one statement.

    Fenced: the write happens only if the row still carries the claim's token and is claimed. Call it inside
    your own ``transaction.atomic()`` together with the job's result writes to make them commit (or fail)
    together.

    Args:
        claim: The claim to end.
        set: Fields to write with the completion (values or expressions); ``None`` for none.
        lock_timeout: Seconds (or a ``timedelta``) a lock may be waited for; default
            ``settings.LOCKKIT["LOCK_TIMEOUT"]``; ``None`` leaves the connection's own setting.

    Raises:
        TypeError, ValueError: ``claim`` is not a ``Claim`` or one of its values is invalid, or ``set`` names a
            field that cannot be set or a value its column cannot store.
        StaleClaim: the row no longer carries this claim's token and worker (nothing was written).
    """
    # Validated once (complete_many would check it again).
    _end((inputs.claim(claim),), set, lock_timeout, signals.claim_completed)


acomplete = awaitable(complete)


def complete_many(
    claims: Iterable[Claim],
    *,
    set: dict[str, Any] | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> None:
    """End many claims of one model and alias in one statement; all are written, or none (``StaleClaim``).

    Args:
        claims: Claims of one model on one alias, each row at most once; an empty iterable writes nothing.
        set: Fields to write to every row (values or expressions); ``None`` for none.
        lock_timeout: Seconds (or a ``timedelta``) a lock may be waited for; default
            ``settings.LOCKKIT["LOCK_TIMEOUT"]``; ``None`` leaves the connection's own setting.

    Raises:
        TypeError, ValueError: not an iterable of ``Claim``, an invalid claim, claims of different
            models/aliases or repeated rows, a bad ``set``.
        StaleClaim: at least one claim no longer holds its row; ``.claims`` lists those; nothing was written.
    """
    _end(inputs.claims(claims), set, lock_timeout, signals.claim_completed)


acomplete_many = awaitable(complete_many)


def release(
    claim: Claim,
    *,
    set: dict[str, Any] | None = None,
    attempted: bool = True,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> None:
    """Give a job back unfinished, writing ``set`` (e.g. ``{"state": "pending"}``) in one fenced statement.

    The row becomes free for ``claim``/``claim_next`` again (if it matches their querysets); ``attempts``
    keeps counting, unless ``attempted=False``.

    Args:
        claim: The claim to end.
        set: Fields to write with the release (values or expressions); ``None`` for none.
        attempted: ``False`` for a job given back without being started (a worker stopping with claimed jobs
            it never ran): the same statement takes the claim's attempt back (``attempts = attempts - 1``), so a
            job given back again and again never reaches a ``max_attempts``.
        lock_timeout: Seconds (or a ``timedelta``) a lock may be waited for; default
            ``settings.LOCKKIT["LOCK_TIMEOUT"]``; ``None`` leaves the connection's own setting.

    Raises:
        TypeError, ValueError: ``claim`` is not a ``Claim`` or one of its values is invalid, or ``set`` names a
            field that cannot be set or a value its column cannot store.
        StaleClaim: the row no longer carries this claim's token and worker (nothing was written).
    """
    if not isinstance(attempted, bool):
        raise TypeError(f"attempted must be a bool, not {type(attempted).__name__}")
    # Validated once (release_many would check it again).
    _end((inputs.claim(claim),), set, lock_timeout, signals.claim_released, attempted=attempted)


arelease = awaitable(release)


def release_many(
    claims: Iterable[Claim],
    *,
    set: dict[str, Any] | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> None:
    """Release many claims of one model and alias in one statement; all are written, or none (``StaleClaim``).

    The same statement as ``complete_many`` (both end the claims); the two names say what ``set`` means.

    Args:
        claims: Claims of one model on one alias, each row at most once; an empty iterable writes nothing.
        set: Fields to write to every row (values or expressions); ``None`` for none.
        lock_timeout: Seconds (or a ``timedelta``) a lock may be waited for; default
            ``settings.LOCKKIT["LOCK_TIMEOUT"]``; ``None`` leaves the connection's own setting.

    Raises:
        TypeError, ValueError, StaleClaim: as ``complete_many``.
    """
    _end(inputs.claims(claims), set, lock_timeout, signals.claim_released)


arelease_many = awaitable(release_many)


def _end(
    claims: tuple[Claim, ...],
    values: dict[str, Any] | None,
    lock_timeout: Any,
    signal: Any,
    *,
    attempted: bool = True,
) -> None:
    """End claims: the one implementation of ``complete_many`` and ``release_many``.

    Completing and releasing write the same thing (the claim ends: ``lease_expires_at = NULL``, plus the
    caller's ``set``); they differ only in what the caller's ``set`` says about the job.
    """
    if not claims:
        if values is not None and not isinstance(values, dict):
            raise TypeError(f"set must be a dict of field names to values, not {type(values).__name__}")
        return  # no model to check the field names against, and nothing to write
    model = claims[0].model
    alias = claims[0].alias
    assignments = {"lease_expires_at": None, **inputs.assignments(model, values, "set", alias)}
    if not attempted:
        if "attempts" in assignments:
            raise ValueError(
                "set must not name attempts with attempted=False (the release takes the attempt back)"
            )
        assignments["attempts"] = F("attempts") - 1
    doing = "completing" if signal is signals.claim_completed else "releasing"
    fenced_update(claims, assignments, lock_timeout, doing=doing)
    events.claims_event(signal, Claim, claims)


__all__ = [
    "acomplete",
    "acomplete_many",
    "arelease",
    "arelease_many",
    "complete",
    "complete_many",
    "release",
    "release_many",
]
