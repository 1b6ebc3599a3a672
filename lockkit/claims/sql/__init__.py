"""The claims statements per vendor, kept together next to the claims (``claims_sql_for``).

``base.ClaimsSQL`` is the interface and what every vendor shares; ``postgresql`` sends one statement per call,
``serial`` (MariaDB/MySQL in ``mysql``, SQLite in ``sqlite``) picks, then writes by primary key. Adding a vendor's
claims is one module here and one entry in ``_BY_VENDOR``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from django.db import NotSupportedError, connections

from lockkit.backends import backend_for, vendors
from lockkit.claims.sql.base import ClaimsSQL
from lockkit.claims.sql.base import zoneless as zoneless
from lockkit.claims.sql.mysql import MySQLClaimsSQL
from lockkit.claims.sql.postgresql import PostgreSQLClaimsSQL
from lockkit.claims.sql.sqlite import SQLiteClaimsSQL
from lockkit.claims.sql.table import ClaimTable
from lockkit.errorcodes.translate import translating

if TYPE_CHECKING:
    from django.db.models import Model

#: The claims statements of each vendor, keyed by Django's ``connection.vendor``.
_BY_VENDOR: dict[str, type[ClaimsSQL]] = {
    "postgresql": PostgreSQLClaimsSQL,
    "mysql": MySQLClaimsSQL,
    "sqlite": SQLiteClaimsSQL,
}


def claims_sql_for(model: type[Model], alias: str) -> ClaimsSQL:
    """The claims statements of ``model``'s table on ``alias``, for the alias's vendor.

    Raises:
        NotSupportedError: claims are not implemented for the alias's vendor, or its version lacks what they
            need (``SKIP LOCKED``: MariaDB 10.6, MySQL 8.0.1; ``RETURNING``: SQLite 3.35).
        lockkit.ConnectionLost: the version had to be asked of a server that refused the connection.
    """
    connection = connections[alias]
    kind = _BY_VENDOR.get(connection.vendor)
    backend = backend_for(connection)
    # Django may ask the server for its version first (MariaDB, a connection's first use): a refusal is typed.
    with translating(alias, nowait=False):
        usable = kind is not None and backend.features.claims_supported(connection)
    if kind is None or not usable:
        supported = ", ".join(sorted(b.features.claims_name for b in vendors() if b.features.claims_name))
        older = f"an older {connection.display_name}" if kind is not None else connection.vendor
        raise NotSupportedError(f"lockkit.claims supports {supported} only; database {alias!r} is {older}")
    return _statements(kind, model, alias)


@functools.lru_cache(maxsize=256)
def _statements(kind: type[ClaimsSQL], model: type[Model], alias: str) -> ClaimsSQL:
    """One ``ClaimsSQL`` per vendor class, model and alias: it holds only quoted names, read once."""
    return kind(ClaimTable.of(model, alias))
