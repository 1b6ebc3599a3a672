"""MariaDB/MySQL: session-scoped timeouts restored after the transaction, GET_LOCK, InnoDB lock waits, claims SQL."""

from lockkit.backends.mysql.backend import MySQLBackend

__all__ = ["MySQLBackend"]
