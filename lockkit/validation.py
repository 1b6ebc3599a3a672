"""Validating arguments by name: durations, positive integers and flags.

Every function raises ``TypeError`` for a wrong type and ``ValueError`` for a wrong value, naming the parameter,
before any SQL runs. This module imports nothing from lockkit.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TypeAlias

#: A duration as the public API takes it: seconds (``int``/``float``) or a ``timedelta``.
Duration: TypeAlias = float | int | timedelta

# PostgreSQL stores timeouts as a 32-bit count of milliseconds.
MAX_SECONDS = 2_147_483_647 / 1000


def duration(value: object, name: str) -> float:
    """Return ``value`` as a positive, finite number of seconds.

    Args:
        value: Seconds as an ``int``/``float``, or a ``timedelta``.
        name: The parameter's name, for the error message.

    Returns:
        The duration in seconds.

    Raises:
        TypeError: ``value`` is ``None``, a ``bool``, a string or another type that is not a duration.
        ValueError: ``value`` is zero, negative, NaN, infinite or larger than PostgreSQL accepts (about 24.8 days).
    """
    if value is None:
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


def optional_duration(value: object, name: str) -> float | None:
    """Return ``None`` for ``None``, else ``duration(value, name)``.

    Raises:
        TypeError, ValueError: as ``duration()``.
    """
    return None if value is None else duration(value, name)


def milliseconds(seconds: float) -> int:
    """Round seconds to whole milliseconds, never down to 0 (which PostgreSQL reads as "no timeout")."""
    return max(1, round(seconds * 1000))


def flag(value: object, name: str) -> bool:
    """Return ``value`` if it is a ``bool``.

    Raises:
        TypeError: ``value`` is not ``True`` or ``False`` (``0``/``1`` included).
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__}")
    return value


def positive_int(value: object, name: str, *, maximum: int | None = None, bound: str = "") -> int:
    """Return ``value`` if it is an ``int`` of at least 1 (and at most ``maximum`` when given).

    Args:
        value: The value to check.
        name: The parameter's name, for the error message.
        maximum: The largest value accepted, or ``None`` for no limit.
        bound: Why ``maximum`` is the limit, appended to the message (``" (a PostgreSQL bigint)"``).

    Raises:
        TypeError: ``value`` is a ``bool`` or not an ``int``.
        ValueError: ``value`` is below 1 or above ``maximum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}{bound}, got {value}")
    return value
