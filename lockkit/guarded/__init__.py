"""``guarded_update``: a conditional ``UPDATE ... RETURNING`` in one round trip, retried like a locked operation."""

from __future__ import annotations

from lockkit.guarded.api import guarded_update

__all__ = ["guarded_update"]
