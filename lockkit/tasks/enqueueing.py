"""Writing an enqueued task: its one statement, and which transaction it joins when the table is on another alias.

On PostgreSQL the ``INSERT`` and the ``NOTIFY`` that wakes idle workers are one statement (the ``INSERT`` in a
data-modifying CTE, always run to completion; ``pg_notify`` in the outer ``SELECT``). PostgreSQL folds identical
notifications of one transaction into one, so a transaction of many enqueues wakes the workers once. See
https://www.postgresql.org/docs/current/queries-with.html#QUERIES-WITH-MODIFYING and
https://www.postgresql.org/docs/current/sql-notify.html.

Outside any transaction the insert commits at once (autocommit), retried through lockkit's one retry path
(``call_with_retry``, ``settings.LOCKKIT["RETRY"]``): a server that refuses connections is tried again (nothing was
sent); a reply lost after the statement went is decided from the rows once the server session that had it ended
(the engine's ``outcome.await_session_end``; the task's id is known before it is sent): written (done), not written
(sent again, same id), or ``CommitOutcomeUnknown``. Inside a transaction its errors are the caller's transaction's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, Error, connections, transaction

from lockkit._engine import commits, cursors, outcome
from lockkit._engine.liveness import discard_after_loss
from lockkit.backends import backend_for
from lockkit.errorcodes.translate import translating
from lockkit.errors import CommitOutcomeUnknown, ConnectionLost, Failure
from lockkit.retries import call_with_retry, from_settings, reconnect_budget
from lockkit.scopes.stack import innermost_scope
from lockkit.tasks.notify import CHANNEL


def _manual(connection: Any) -> bool:
    """Whether ``connection`` is open in a transaction the caller manages (autocommit off, outside ``atomic()``)."""
    return (
        connection.connection is not None
        and not connection.in_atomic_block
        and not connection.get_autocommit()
    )


def write(row: Any, alias: str, notify: str | None, then: Callable[[], object]) -> None:
    """Insert ``row`` (a ``QueuedTask``) on ``alias`` in the caller's transaction, then call ``then()``.

    In an open ``atomic()`` on ``alias`` the row joins it. Otherwise, when a transaction is open on one other
    alias (the caller's: a ``locked()`` scope's alias first), the insert is deferred to that transaction's
    commit, so a rolled-back or retried caller leaves no task; with none open it commits at once (and an open
    lockkit attempt elsewhere is told: it is not run again).

    Args:
        row: The unsaved task row.
        alias: The task table's alias.
        notify: The queue whose idle PostgreSQL workers are woken on commit, or ``None``.
        then: Called once the row is written (the ``task_enqueued`` signal).

    With autocommit off on ``alias`` (a transaction the caller manages) the row joins that transaction; with
    autocommit off on another alias the call is refused, as Django's ``on_commit()`` is.

    Raises:
        django.db.transaction.TransactionManagementError: transactions are open on several other aliases and
            none of them is a lockkit scope's: which one the task belongs to is unknown; or autocommit is off on
            another alias.
        lockkit.ConnectionLost: committing at once, the connection was refused or lost and the row certainly
            not written, on every attempt ``settings.LOCKKIT["RETRY"]`` allows.
        lockkit.CommitOutcomeUnknown: committing at once, the reply was lost and whether the row was written
            could not be found out.
    """
    connection = connections[alias]

    def insert() -> None:
        if connection.in_atomic_block:
            _insert(row, connection, notify)
        else:
            _insert_at_once(row, alias, notify)
        then()

    if connection.in_atomic_block:
        insert()
        return
    if _manual(connection):  # the caller's own transaction (autocommit off): the row joins it, as in atomic()
        _insert(row, connection, notify)
        then()
        return
    manual = sorted(
        c.alias for c in connections.all(initialized_only=True) if c.alias != alias and _manual(c)
    )
    if manual:  # as Django's on_commit(): a manual transaction has no commit hook to defer the insert to
        raise transaction.TransactionManagementError(
            f"enqueue(): the task table is on {alias!r} and a transaction is open with autocommit off on "
            f"{', '.join(map(repr, manual))}: the task would commit on its own, whatever that transaction does. "
            f"Enqueue after its commit, or inside atomic()"
        )
    callers = [
        c.alias for c in connections.all(initialized_only=True) if c.in_atomic_block and c.alias != alias
    ]
    if not callers:
        insert()
        return
    scope = innermost_scope()
    if scope is not None and scope.alias in callers:
        scope.on_commit(insert)
    elif len(callers) == 1:
        transaction.on_commit(insert, using=callers[0])
    else:
        names = ", ".join(map(repr, sorted(callers)))
        raise transaction.TransactionManagementError(
            f"enqueue(): the task table is on {alias!r} and transactions are open on {names}: which one the task "
            f"belongs to is unknown. Enqueue from transaction.on_commit(..., using=<the caller's alias>), or "
            f"inside atomic(using={alias!r}) to join the task table's transaction"
        )


#: What an enqueue committing at once retries: a connection refused or lost before the row was written.
_RETRIED = frozenset({Failure.CONNECTION_LOST})
_OPERATION = "lockkit.tasks.enqueue"
_WHAT = "the INSERT of a task"


def _insert_at_once(row: Any, alias: str, notify: str | None) -> None:
    """Insert ``row`` outside any transaction on ``alias``, committed at once; a lost reply decided from the rows."""
    connection = connections[alias]
    setting = from_settings(retry_on=_RETRIED)
    within = reconnect_budget(setting)

    sessions = backend_for(connection).sessions
    # Built in the first attempt, typed like its failures: the values may need the server (MariaDB's version).
    statement: list[tuple[str, list[Any]]] = []

    def attempt(number: int) -> None:
        session: list[int | None] = []  # the server session the statement was handed to, once it was
        try:
            with translating(alias, nowait=False, attempts=number), cursors.kept(connection) as cursor:
                if not statement:
                    statement.append(_statement_of(row, connection, notify))
                sql, params = statement[0]
                # Read once connected: a health check (CONN_HEALTH_CHECKS) may have replaced the connection.
                session.append(sessions.local_session_id(connection))
                cursor.execute(sql, params)
        except ConnectionLost as lost:
            discard_after_loss(alias)
            if not session:
                raise  # refused, or lost while connecting: nothing was sent (retried)
            _decide(row, alias, session[0], lost, within)
        except Error:
            raise
        except BaseException as interrupt:  # not the database's (Ctrl-C, a signal handler's exception)
            if session:
                _note_interrupted(row, alias, session[0], interrupt, within)
            raise
        commits.committed(alias)

    if setting is None:
        attempt(1)
    else:
        call_with_retry(setting, attempt, alias=alias, operation=_OPERATION)


def _decide(row: Any, alias: str, pid: int | None, lost: ConnectionLost, within: float) -> None:
    """The reply to the insert of ``row`` was lost: return if it was written, raise ``lost`` if it certainly was not.

    The row is looked up by its id and what only this enqueue wrote (``enqueued_at``, ``task_path``). Not found,
    the server session the insert went on (``pid``) is waited out (it has committed or rolled back, or is gone),
    reconnecting for up to ``within`` seconds, and the row looked up again: not found then, it cannot appear later.
    A session that cannot be named (no ``pid``, or a pooler's id) leaves a row not found undecided.

    Raises:
        lockkit.ConnectionLost: ``lost``: the row was not written (retried, with the same id; another row with
            that id, a custom ``id_function``'s repeat, is not this one: sent again, the database refuses it).
        lockkit.CommitOutcomeUnknown: the session could not be waited out, or the row could not be read.
    """
    found = (
        type(row)
        ._base_manager.using(alias)
        .filter(pk=row.pk, enqueued_at=row.enqueued_at, task_path=row.task_path)
    )
    with contextlib.suppress(DatabaseError):  # unreachable for now: waited out below
        if found.exists():
            return
    # Not (yet) there: certain only once the session that had it has ended; then read again (it may have
    # committed meanwhile).
    outcome.await_session_end(alias, pid, lost, within=within, what=_WHAT)
    try:
        written = found.exists()
    except DatabaseError:
        discard_after_loss(alias)
        raise outcome.unknown(alias, lost, what=_WHAT) from lost
    if not written:
        raise lost


def _note_interrupted(row: Any, alias: str, pid: int | None, interrupt: BaseException, within: float) -> None:
    """Say on ``interrupt`` whether the task it interrupted was enqueued (decided as a lost reply's outcome)."""
    with contextlib.suppress(Error):
        connections[alias].close()  # its driver may be mid-reply
    lost = ConnectionLost(
        f"{type(interrupt).__name__} interrupted the INSERT of a task on {alias!r}", alias=alias
    )
    try:
        _decide(row, alias, pid, lost, within)
    except CommitOutcomeUnknown:
        interrupt.add_note(
            f"lockkit: whether task {row.pk} was enqueued on {alias!r} is unknown: look it up before enqueueing "
            "it again"
        )
    except (ConnectionLost, Error):
        interrupt.add_note(f"lockkit: task {row.pk} was not enqueued")
    else:
        interrupt.add_note(f"lockkit: task {row.pk} was enqueued on {alias!r} before this was raised")


def _insert(row: Any, connection: Any, notify: str | None) -> None:
    sql, params = _statement_of(row, connection, notify)
    with cursors.kept(connection) as cursor:
        cursor.execute(sql, params)


def _statement_of(row: Any, connection: Any, notify: str | None) -> tuple[str, list[Any]]:
    """The insert of ``row`` (with PostgreSQL's ``NOTIFY`` for ``notify``) and its values."""
    postgresql = connection.vendor == "postgresql"
    # Only the columns with a value: a column left out is NULL (no task column has a database default), and the
    # driver quotes fewer parameters (most of an enqueue's time in the client).
    fields = []
    values = []
    for field in type(row)._meta.concrete_fields:
        value = getattr(row, field.attname)
        if value is not None:
            fields.append(field)
            values.append(field.get_db_prep_save(value, connection))
    sql = _statement(connection, type(row), tuple(fields), postgresql and notify is not None)
    return sql, [*values, CHANNEL, notify] if postgresql and notify is not None else values


def _statement(connection: Any, model: Any, fields: tuple[Any, ...], notify: bool) -> str:
    """The ``INSERT`` of ``fields`` of one task row; with ``notify``, PostgreSQL's one statement with the ``NOTIFY``."""
    key = (model, connection.vendor, fields, notify)
    found = _STATEMENTS.get(key)
    if found is None:
        if len(_STATEMENTS) >= _KEPT:
            _STATEMENTS.clear()
        found = _STATEMENTS[key] = _compose(connection.ops.quote_name, model, fields, notify)
    return found


#: The statement per (model, vendor, columns written, notify): the quoting of names is the vendor's. A task's
#: columns without a value vary in a few ways only (``run_after`` given or not sets two of them).
_STATEMENTS: dict[tuple[Any, str, tuple[Any, ...], bool], str] = {}
_KEPT = 64


def _compose(quote: Callable[[str], str], model: Any, fields: tuple[Any, ...], notify: bool) -> str:
    insert = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    return f"WITH inserted AS ({insert}) SELECT pg_notify(%s, %s)" if notify else insert
