"""The claims functions, sending ``lockkit.signals``' claim signals when they have receivers.

Wrappers around ``lockkit.claims.api`` (which stays free of observation code): each checks its signal's receivers
first, so an unobserved call pays one attribute check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from django.db.models import QuerySet

from lockkit import aliases, events, signals
from lockkit.claims import api
from lockkit.claims.value import Claim
from lockkit.errors import StaleClaim

F = TypeVar("F", bound=Callable[..., Any])


def _stale(error: StaleClaim) -> None:
    events.claims_event(signals.claim_stale, Claim, error.claims, error=error)


def _made(func: F) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        if signals.claim_made.receivers and result:
            made = result if isinstance(result, list) else [result]
            made = [getattr(item, "claim", item) for item in made]  # Claimed(instance, claim) with fetch=True
            events.claims_event(signals.claim_made, Claim, made, worker=made[0].worker)
        return result

    return wrapper  # type: ignore[return-value]


def _fenced(func: F, signal: Any = None, *, many: bool = False) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not args or not (signals.claim_stale.receivers or (signal is not None and signal.receivers)):
            return func(*args, **kwargs)
        first, rest = args[0], args[1:]
        claims = list(first) if many else [first]
        try:
            result = func(claims if many else first, *rest, **kwargs)
        except StaleClaim as error:
            _stale(error)
            raise
        if signal is not None:
            events.claims_event(signal, Claim, claims)
        return result

    return wrapper  # type: ignore[return-value]


def _reclaimed(func: F) -> F:
    @functools.wraps(func)
    def wrapper(queryset: QuerySet[Any], /, *args: Any, **kwargs: Any) -> Any:
        count = func(queryset, *args, **kwargs)
        if count and signals.claim_reclaimed.receivers:
            alias = aliases.resolve(kwargs.get("using") or getattr(queryset, "_db", None), queryset.model)
            events.send(signals.claim_reclaimed, Claim, model=queryset.model, alias=alias, count=count)
        return count

    return wrapper  # type: ignore[return-value]


claim = _made(api.claim)
claim_next = _made(api.claim_next)
heartbeat = _fenced(api.heartbeat)
complete = _fenced(api.complete, signals.claim_completed)
complete_many = _fenced(api.complete_many, signals.claim_completed, many=True)
release = _fenced(api.release, signals.claim_released)
release_many = _fenced(api.release_many, signals.claim_released, many=True)
reclaim_expired = _reclaimed(api.reclaim_expired)
held_by = api.held_by  # a read: no signal

__all__ = [
    "claim",
    "claim_next",
    "complete",
    "complete_many",
    "heartbeat",
    "held_by",
    "reclaim_expired",
    "release",
    "release_many",
]
