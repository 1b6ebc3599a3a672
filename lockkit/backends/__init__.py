"""What differs per database vendor, behind one small interface: ``backend_for(connection)``.

Each vendor is one package (``postgresql/``, ``mysql/``, ``sqlite/``) holding its timeouts, locks, lock waits,
sessions and claims SQL, and one entry in ``_BY_VENDOR`` (keyed by Django's ``connection.vendor``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from django.db import NotSupportedError, connections

from lockkit.backends.base import Backend, ContentionSQL, TimeoutToken
from lockkit.backends.mysql import MySQLBackend
from lockkit.backends.postgresql import PostgreSQLBackend
from lockkit.backends.sql.table import ClaimTable
from lockkit.backends.sqlite import SQLiteBackend

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models import Model

    from lockkit.backends.sql.claims import ClaimsSQL

__all__ = ["Backend", "ContentionSQL", "TimeoutToken", "backend_for", "claims_sql_for", "has_backend"]

_BY_VENDOR: dict[str, Backend] = {
    "postgresql": PostgreSQLBackend(),
    "mysql": MySQLBackend(),
    "sqlite": SQLiteBackend(),
}
_GENERIC = Backend()


def backend_for(connection: BaseDatabaseWrapper) -> Backend:
    """Return the lockkit backend for a Django connection (a generic one for vendors without special support)."""
    return _BY_VENDOR.get(connection.vendor, _GENERIC)


def has_backend(vendor: str) -> bool:
    """Whether lockkit has vendor-specific support (timeouts, transaction start) for Django's ``vendor`` name."""
    return vendor in _BY_VENDOR


def claims_sql_for(model: type[Model], alias: str) -> ClaimsSQL:
    """The claims statements of ``model``'s table on ``alias``, for the alias's vendor.

    Raises:
        NotSupportedError: claims are not implemented for the alias's vendor, or its version lacks what they
            need (``SKIP LOCKED``: MariaDB 10.6, MySQL 8.0.1; ``RETURNING``: SQLite 3.35).
    """
    connection = connections[alias]
    backend = backend_for(connection)
    kind = backend.claims_sql
    if kind is None or not backend.claims_supported(connection):
        supported = ", ".join(sorted(b.claims_name for b in _BY_VENDOR.values() if b.claims_sql is not None))
        older = f"an older {connection.display_name}" if kind is not None else connection.vendor
        raise NotSupportedError(f"lockkit.claims supports {supported} only; database {alias!r} is {older}")
    return _statements(kind, model, alias)


@functools.lru_cache(maxsize=256)
def _statements(kind: type[ClaimsSQL], model: type[Model], alias: str) -> ClaimsSQL:
    """One ``ClaimsSQL`` per vendor class, model and alias: it holds only quoted names, read once."""
    return kind(ClaimTable.of(model, alias))
