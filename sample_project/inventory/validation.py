"""Argument checks shared by the inventory services: they run before any SQL."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def check_sku(sku: object, name: str = "sku") -> str:
    if not isinstance(sku, str):
        raise TypeError(f"{name} must be a str, not {type(sku).__name__}")
    if not sku:
        raise ValueError(f"{name} must not be empty")
    return sku


def check_quantity(quantity: object, name: str = "quantity") -> int:
    if isinstance(quantity, bool) or not isinstance(quantity, int):
        raise TypeError(f"{name} must be an int, not {type(quantity).__name__}")
    if quantity < 1:
        raise ValueError(f"{name} must be a positive int, got {quantity}")
    return quantity


def check_flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__}")
    return value


def check_lines(lines: object) -> dict[str, int]:
    """Return an order's lines as ``{sku: total quantity}`` (repeated SKUs are added up).

    Accepts a mapping ``{sku: quantity}`` or an iterable of ``(sku, quantity)`` pairs.
    """
    if isinstance(lines, Mapping):
        pairs: Iterable[object] = lines.items()
    elif isinstance(lines, str | bytes) or not isinstance(lines, Iterable):
        raise TypeError(
            f"lines must be a mapping or an iterable of (sku, quantity) pairs, not {type(lines).__name__}"
        )
    else:
        pairs = lines
    merged: dict[str, int] = {}
    for index, pair in enumerate(pairs):
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise TypeError(f"lines[{index}] must be a (sku, quantity) pair, not {pair!r}")
        sku = check_sku(pair[0], f"lines[{index}] sku")
        quantity = check_quantity(pair[1], f"lines[{index}] quantity")
        merged[sku] = merged.get(sku, 0) + quantity
    if not merged:
        raise ValueError("lines must hold at least one (sku, quantity) pair")
    return merged
