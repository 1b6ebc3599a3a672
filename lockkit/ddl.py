"""Bounded lock waits for migrations and autocommit code, so ``ALTER TABLE`` on a busy table fails fast.

An ``ALTER TABLE`` that waits for a lock queues every later query of that table behind it: without a bound, one
long transaction turns a migration into an outage. ``Bounded`` (a migration operation) and ``bounded_lock_waits``
(a context manager) make such a wait fail with ``LockTimeout`` after a few seconds instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState

from lockkit.backends import backend_for
from lockkit.errorcodes.translate import translating
from lockkit.scopes.aliases import check_alias
from lockkit.validation import duration


def _in_transaction(connection: BaseDatabaseWrapper) -> bool:
    return bool(connection.in_atomic_block or not connection.get_autocommit())


@contextmanager
def _bounded(connection: BaseDatabaseWrapper, lock_timeout: float) -> Iterator[None]:
    backend = backend_for(connection)
    in_transaction = _in_transaction(connection)
    with translating(connection.alias, nowait=False):
        token = backend.locks.bound_lock_waits(connection, lock_timeout, in_transaction=in_transaction)
        try:
            yield
        finally:
            if not (in_transaction and backend.features.lock_waits_bound_end_with_transaction):
                backend.locks.unbound_lock_waits(connection, token)


@contextmanager
def bounded_lock_waits(lock_timeout: float, *, using: str | None = None) -> Iterator[None]:
    """Bound how long the statements of the block may wait for a lock, DDL included.

    Inside a transaction on PostgreSQL the bound is transaction-scoped (``set_config('lock_timeout', ..., true)``)
    and lasts until that transaction ends; outside one (autocommit code, a non-atomic migration) and on
    MariaDB/MySQL (``lock_wait_timeout`` for metadata locks and ``innodb_lock_wait_timeout`` for rows, whole
    seconds rounded up) it is session-scoped and the previous value is put back when the block exits, on every
    path; if that fails the connection is closed, so the value never reaches its next user. On SQLite it is the
    busy timeout. See https://www.postgresql.org/docs/current/runtime-config-client.html#GUC-LOCK-TIMEOUT and
    https://mariadb.com/kb/en/server-system-variables/#lock_wait_timeout.

    Args:
        lock_timeout: Seconds (``int``/``float``) or a ``timedelta`` a statement may wait for a lock.
        using: The database alias (default ``"default"``).

    Yields:
        Nothing; run the statements inside the block on ``using``'s connection of this thread.

    Raises:
        TypeError, ValueError: a bad ``lock_timeout`` or alias, before any SQL runs.
        LockTimeout: a statement of the block waited longer than ``lock_timeout``.
        django.db.NotSupportedError: lockkit cannot bound lock waits on this database.
    """
    limit = duration(lock_timeout, "lock_timeout")
    connection = connections[check_alias(using if using is not None else DEFAULT_DB_ALIAS)]
    with _bounded(connection, limit):
        yield


class Bounded(Operation):
    """A migration operation that runs other operations with their lock waits bounded.

    ``Bounded([migrations.AddField(...)], lock_timeout=3)``: each wrapped operation runs as it would alone, but a
    lock wait longer than ``lock_timeout`` seconds fails the migration with ``LockTimeout`` instead of queueing
    every other query of the table behind the ``ALTER TABLE``. In an atomic migration on PostgreSQL the bound is
    transaction-scoped and lasts until the migration's transaction ends (its deferred SQL included); in a
    non-atomic migration, and on MariaDB/MySQL, it is session-scoped and reset when the wrapped operations finish,
    whether they succeed or fail. See ``bounded_lock_waits`` and
    https://docs.djangoproject.com/en/stable/ref/migration-operations/.

    Args:
        operations: The migration operations to run, in order (a list, as ``SeparateDatabaseAndState`` takes them).
        lock_timeout: Seconds (``int``/``float``) a statement may wait for a lock.

    Raises:
        TypeError, ValueError: no operations, something that is not an ``Operation``, or a bad ``lock_timeout``,
            when the migration module is loaded.
        LockTimeout: while migrating, a statement waited longer than ``lock_timeout``.
    """

    reduces_to_sql = True

    def __init__(self, operations: list[Operation], lock_timeout: float) -> None:
        """Validate and keep the operations and the bound (see the class)."""
        if isinstance(operations, Operation) or not isinstance(operations, list | tuple):
            raise TypeError(
                f"operations must be a list of migration operations, not {type(operations).__name__}"
            )
        if not operations:
            raise ValueError("Bounded() needs at least one operation")
        for operation in operations:
            if not isinstance(operation, Operation):
                raise TypeError(f"operations must be migration operations, not {type(operation).__name__}")
        limit = duration(lock_timeout, "lock_timeout")
        self.operations = list(operations)
        self.lock_timeout = lock_timeout
        self._limit = limit
        # Per instance, as Django's RunSQL/RunPython do; the stubs declare them class variables.
        self.reversible = all(operation.reversible for operation in operations)  # type: ignore[misc]
        self.atomic = any(getattr(operation, "atomic", False) for operation in operations)  # type: ignore[misc]

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        """Return the arguments Django's migration writer serialises (the class name only)."""
        # The class name only: Django's migration writer imports the class's module itself.
        return ("Bounded", [], {"operations": list(self.operations), "lock_timeout": self.lock_timeout})

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        """Apply each wrapped operation to the project state, in order."""
        for operation in self.operations:
            operation.state_forwards(app_label, state)

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        """Run each wrapped operation forwards with lock waits bounded."""
        # Each operation sees the state just before and after itself, as in Django's own migration executor.
        with _bounded(schema_editor.connection, self._limit):
            for operation in self.operations:
                after = from_state.clone()
                operation.state_forwards(app_label, after)
                operation.database_forwards(app_label, schema_editor, from_state, after)
                from_state = after

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        """Undo the wrapped operations, newest first, with lock waits bounded."""
        # The states before each operation, from the oldest (to_state); undone newest first.
        states = [to_state]
        for operation in self.operations[:-1]:
            state = states[-1].clone()
            operation.state_forwards(app_label, state)
            states.append(state)
        with _bounded(schema_editor.connection, self._limit):
            after = from_state
            for operation, before in zip(reversed(self.operations), reversed(states), strict=True):
                operation.database_backwards(app_label, schema_editor, after, before)
                after = before

    def describe(self) -> str:
        """Describe the bound and the wrapped operations."""
        inner = "; ".join(operation.describe() for operation in self.operations)
        return f"With lock waits bounded to {self.lock_timeout}s: {inner}"

    @property
    def migration_name_fragment(self) -> str:
        """Name a migration after its first wrapped operation."""
        return self.operations[0].migration_name_fragment


__all__ = ["Bounded", "bounded_lock_waits"]
