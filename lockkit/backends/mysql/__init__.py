"""MariaDB/MySQL: session-scoped timeouts restored after the transaction, GET_LOCK, InnoDB lock waits, claims SQL."""

from lockkit.backends.mysql.backend import (
    MySQLBackend,
    MySQLFeatures,
    MySQLLocks,
    MySQLSessions,
    MySQLTransactions,
)

__all__ = ["MySQLBackend", "MySQLFeatures", "MySQLLocks", "MySQLSessions", "MySQLTransactions"]
