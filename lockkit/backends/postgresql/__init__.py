"""PostgreSQL: transaction-scoped timeouts, the one-message opening, advisory locks, lock waits, claims SQL."""

from lockkit.backends.postgresql.backend import (
    PostgreSQLBackend,
    PostgreSQLFeatures,
    PostgreSQLLocks,
    PostgreSQLSessions,
    PostgreSQLTransactions,
)

__all__ = [
    "PostgreSQLBackend",
    "PostgreSQLFeatures",
    "PostgreSQLLocks",
    "PostgreSQLSessions",
    "PostgreSQLTransactions",
]
