"""SQLite: BEGIN IMMEDIATE with the busy timeout as the lock timeout, claims SQL."""

from lockkit.backends.sqlite.backend import (
    SQLiteBackend,
    SQLiteFeatures,
    SQLiteLocks,
    SQLiteSessions,
    SQLiteTransactions,
)

__all__ = ["SQLiteBackend", "SQLiteFeatures", "SQLiteLocks", "SQLiteSessions", "SQLiteTransactions"]
