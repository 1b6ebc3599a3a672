"""The failed statements of an outermost scope, seen through Django's ``execute_wrapper()`` (private to lockkit).

MariaDB/MySQL keep no "aborted" transaction state a scope could read before it commits: InnoDB rolls the whole
transaction back on a deadlock and runs later statements in a new one; an ORM write that failed marks Django's
block for rollback. A body that swallowed either must not be told "done". See
https://docs.djangoproject.com/en/stable/topics/db/instrumentation/ and
https://mariadb.com/kb/en/innodb-lock-modes/#deadlocks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, Error
from django.db.transaction import TransactionManagementError

from lockkit.errorcodes.table import chain, code_of

# The errors after which InnoDB has rolled the whole transaction back (savepoints included) and carries on: a
# deadlock, and a locking read of a row changed since the snapshot (MariaDB's innodb_snapshot_isolation).
_WHOLE_TRANSACTION = frozenset({"1213", "1020"})


class FailedStatements:
    """An ``execute_wrapper`` that remembers the database errors statements of the scope's block raised.

    Attributes:
        last: The first failed statement's error since the last rollback to a savepoint (Django's way of
            undoing a failed statement), else ``None``; Django's refusals after it are not counted.
        rolled_back: The first error after which the server rolled the whole transaction back, else ``None``;
            never forgotten, as a savepoint cannot undo it.
    """

    def __init__(self) -> None:
        """Nothing failed yet."""
        self.last: DatabaseError | None = None
        self.rolled_back: DatabaseError | None = None

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        """Run the statement; remember its database error, which still propagates."""
        try:
            result = execute(sql, params, many, context)
        except TransactionManagementError:
            raise  # Django refusing statements after a failure: the failure itself was recorded first
        except DatabaseError as exc:
            if self.last is None:
                self.last = exc
            if self.rolled_back is None and code_of(exc) in _WHOLE_TRANSACTION:
                self.rolled_back = exc
            raise
        if isinstance(sql, str) and sql.lstrip()[:20].upper().startswith("ROLLBACK TO"):
            self.last = None  # a savepoint undid the failed statement (Django's atomic(), or the body's own)
        return result

    def swallowed(self) -> DatabaseError | None:
        """The error a body that returned normally swallowed: its transaction cannot commit as written.

        A failed statement no savepoint undid: on PostgreSQL it aborts the transaction; on MariaDB/MySQL it undoes
        only itself (a lock wait timeout, 1205, by default), or the whole transaction (a deadlock), and the COMMIT
        would commit what the body wrote around it. Both vendors refuse it alike.
        """
        return self.rolled_back if self.rolled_back is not None else self.last


# mysqlclient's CR_COMMANDS_OUT_OF_SYNC: a statement's result was left unread (an exception interrupted it).
_COMMANDS_OUT_OF_SYNC = "2014"


def interrupt_behind(connection: Any, exc: BaseException | None) -> BaseException | None:
    """The exception (a signal handler's) that the driver's "commands out of sync" replaced, if any.

    mysqlclient runs a signal handler once the server's reply has arrived, before the result is read: the exception
    leaves the statement, Django's cleanup closes the cursor, and mysqlclient refuses that with 2014
    (``CR_COMMANDS_OUT_OF_SYNC``), which hides the interrupt as its context. The scope then raises the interrupt,
    so a task runner's time limit reaches the code that catches it.
    """
    database_errors = driver_errors(connection)
    if exc is None or not isinstance(exc, database_errors) or code_of(exc) != _COMMANDS_OUT_OF_SYNC:
        return None
    return next((link for link in chain(exc) if not isinstance(link, database_errors)), None)


def driver_errors(connection: Any) -> tuple[type[BaseException], ...]:
    """Django's ``Error`` and the driver's own base class (Django does not wrap the errors of a cursor's close())."""
    driver = getattr(connection, "Database", None)
    return (Error,) if driver is None else (Error, driver.Error)
