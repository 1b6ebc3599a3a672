"""The inventory endpoints' request bodies: JSON objects parsed into dataclasses (``api.parse_body``).

Each dataclass checks its values in ``__post_init__`` with the services' own checks, so a malformed request is
refused with 400 before any SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sample_project.inventory.validation import check_flag, check_lines, check_quantity, check_sku

#: ``impl`` values of ``POST /inventory/reserve``: lockkit's ``locked_update`` and ``guarded_update``, then the
#: hand-written ``select_for_update`` and the naive version (for the demo's comparison).
IMPLEMENTATIONS = ("lockkit", "guarded", "hand", "naive")


@dataclass(frozen=True, kw_only=True)
class ReserveBody:
    """``POST /inventory/reserve``: ``{"sku", "quantity", "impl"?}``."""

    sku: str
    quantity: int
    impl: str = "lockkit"

    def __post_init__(self) -> None:
        check_sku(self.sku)
        check_quantity(self.quantity)
        if self.impl not in IMPLEMENTATIONS:
            raise ValueError(f"impl must be one of {list(IMPLEMENTATIONS)}, got {self.impl!r}")


@dataclass(frozen=True, kw_only=True)
class ReserveInRequestBody:
    """``POST /inventory/reserve-in-request``: ``{"sku", "quantity", "nowait"?}``."""

    sku: str
    quantity: int
    nowait: bool = False

    def __post_init__(self) -> None:
        check_sku(self.sku)
        check_quantity(self.quantity)
        check_flag(self.nowait, "nowait")


@dataclass(frozen=True, kw_only=True)
class OrderBody:
    """``POST /inventory/orders``: ``{"lines": [[sku, quantity], ...]}``; ``lines`` becomes ``{sku: quantity}``."""

    lines: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "lines", check_lines(self.lines))
