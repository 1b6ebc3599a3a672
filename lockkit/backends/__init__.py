"""What differs per database vendor, behind one entry point: ``backend_for(connection)``.

A backend is composed of four small parts (``features``, ``tx``, ``locks``, ``sessions``: ``lockkit.backends.base``).
Each vendor is one package (``postgresql/``, ``mysql/``, ``sqlite/``) subclassing each part, and one entry in
``_BY_VENDOR`` (keyed by Django's ``connection.vendor``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockkit.backends.base import (
    Backend,
    ContentionSQL,
    Features,
    Locks,
    Sessions,
    TimeoutToken,
    Transactions,
)
from lockkit.backends.mysql import MySQLBackend
from lockkit.backends.postgresql import PostgreSQLBackend
from lockkit.backends.sqlite import SQLiteBackend

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = [
    "Backend",
    "ContentionSQL",
    "Features",
    "Locks",
    "Sessions",
    "TimeoutToken",
    "Transactions",
    "backend_for",
    "has_backend",
    "vendors",
]

_BY_VENDOR: dict[str, Backend] = {
    "postgresql": PostgreSQLBackend(),
    "mysql": MySQLBackend(),
    "sqlite": SQLiteBackend(),
}
_GENERIC = Backend()


def backend_for(connection: BaseDatabaseWrapper) -> Backend:
    """Return the lockkit backend for a Django connection (a generic one for vendors without special support)."""
    return _BY_VENDOR.get(connection.vendor, _GENERIC)


def vendors() -> tuple[Backend, ...]:
    """The backends lockkit has vendor-specific support for."""
    return tuple(_BY_VENDOR.values())


def has_backend(vendor: str) -> bool:
    """Whether lockkit has vendor-specific support (timeouts, transaction start) for Django's ``vendor`` name."""
    return vendor in _BY_VENDOR
