"""Validating durations: seconds as ``int``/``float`` or a ``timedelta``; anything else is refused by name."""

from __future__ import annotations

import math
from datetime import timedelta

# PostgreSQL stores timeouts as a 32-bit count of milliseconds.
MAX_SECONDS = 2_147_483_647 / 1000


def seconds(value: object, name: str, *, allow_none: bool = False) -> float | None:
    """Return ``value`` as a positive, finite number of seconds.

    Raises:
        TypeError: ``value`` is a ``bool``, a string or another type that is not a duration (or ``None`` when
            ``allow_none`` is false).
        ValueError: ``value`` is zero, negative, NaN, infinite or larger than PostgreSQL accepts (about 24.8 days).
    """
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{name} must be seconds (int or float) or a timedelta, not None")
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        raise TypeError(f"{name} must be seconds (int or float) or a timedelta, not {type(value).__name__}")
    try:
        result = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except OverflowError:
        raise ValueError(f"{name} must be at most {MAX_SECONDS:.0f} seconds, got an int too large") from None
    if math.isnan(result) or math.isinf(result):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if result <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    if result > MAX_SECONDS:
        raise ValueError(f"{name} must be at most {MAX_SECONDS:.0f} seconds, got {value!r}")
    return result


def milliseconds(value: float) -> int:
    """Round seconds to whole milliseconds, never down to 0 (which PostgreSQL reads as "no timeout")."""
    return max(1, round(value * 1000))
