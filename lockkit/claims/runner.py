"""Running one claims call in a short transaction of its own, retried like a ``locked_operation``.

Two forms, both bounded by the lock timeout (``settings.LOCKKIT["LOCK_TIMEOUT"]`` or the call's ``lock_timeout=``),
both discarding a dead connection before they start and retrying a deadlock, a serialization failure and a
connection lost before anything was sent (``RETRIED``) as ``settings.LOCKKIT["RETRY"]`` says: its attempts, waits,
deadline, hooks and ``reconnect_within``, read per call (``retry_setting``):

- ``in_one_message``: a call of one statement, outside the caller's transaction, on a vendor that can send it as
  one message with its opening and ``COMMIT`` (PostgreSQL on psycopg 3): one round trip. A reply lost after the
  message went is resolved by the caller from the rows themselves (``resolve``).
- ``in_transaction``: anything else, in a ``locked_operation`` scope (inside the caller's own ``atomic()``, a
  savepoint and one attempt).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

from django.db import connections

from lockkit._engine import message as message_
from lockkit._engine import outcome
from lockkit._engine.attempts import in_messages
from lockkit._engine.transaction import in_transaction as inside_transaction
from lockkit.backends import backend_for
from lockkit.claims.sql.base import bounded
from lockkit.errorcodes.translate import translating
from lockkit.errors import ConnectionLost, Failure
from lockkit.operations.operation import LockedOperation
from lockkit.retries import RetrySetting, from_settings, reconnect_budget
from lockkit.scopes.options import FROM_SETTINGS, ScopeOptions
from lockkit.validation import milliseconds

T = TypeVar("T")

#: The kinds a claims call retries, in a fresh transaction: a connection lost before COMMIT, and a deadlock or
#: serialization failure (the database rolled the whole transaction back: on MariaDB a claim is two statements and
#: InnoDB's next-key locks can deadlock it against a completion; under REPEATABLE READ a concurrent claim of the same
#: row is a serialization failure). A lock timeout is the caller's to decide on. Everything else (attempts, waits,
#: deadline, hooks, ``reconnect_within``) comes from ``settings.LOCKKIT["RETRY"]``; ``None`` there: no retries.
RETRIED = frozenset({Failure.CONNECTION_LOST, Failure.DEADLOCK_DETECTED, Failure.SERIALIZATION_FAILURE})

#: Decorated operations by (alias, lock timeout type and value, call site); a few per process in practice.
_OPERATIONS: dict[Hashable, Callable[[Callable[[], Any]], Any]] = {}
_MAX_OPERATIONS = 256

#: ``resolve(message, lost)``: what a call whose reply was lost did, told from the rows; raises when unknown.
Resolve = Callable[[Any, ConnectionLost], T]


def in_one_message(
    alias: str, lock_timeout: Any, work: Callable[[], T], resolve: Resolve[T] | None = None, *, doing: str
) -> T:
    """Run ``work()`` (one claims statement) as one message with its opening and ``COMMIT``, where it can be.

    Elsewhere (inside the caller's transaction, psycopg2, server-side binding, MariaDB/MySQL, SQLite) it is
    ``in_transaction``. A connection lost before the message was sent, a deadlock and a serialization failure are
    retried; a reply lost after it was sent goes to ``resolve``, which tells from the rows what happened (without
    one, ``CommitOutcomeUnknown``).

    ``doing`` says what the call does in the user's words ("claiming tasks"): the retry log lines say it, not the
    name of ``work`` (an internal closure).

    Raises:
        TypeError, ValueError: ``lock_timeout`` is not a positive duration, ``None`` or the settings default.
        LockTimeout: a lock was waited for longer than the lock timeout (nothing was written).
        ConnectionLost: the connection was lost (or refused) before sending, on every attempt for the setting's
            ``reconnect_within`` seconds.
        DeadlockDetected, SerializationFailure: on each attempt ``settings.LOCKKIT["RETRY"]`` allows (3 by default).
        CommitOutcomeUnknown: the reply was lost and the rows cannot say what happened.
    """
    lock, statement = ScopeOptions.build(using=alias, lock_timeout=lock_timeout).timeouts()
    connection = connections[alias]
    backend = backend_for(connection)
    timeouts = {
        name: milliseconds(value)
        for name, value in (("lock_timeout", lock), ("statement_timeout", statement))
        if value is not None
    }
    # An execute wrapper may run statements of its own around the claims statement (an audit): in one message
    # they could not join the claim's transaction, so with any wrapper installed the call runs in a scope.
    if (
        inside_transaction(connection)
        or connection.execute_wrappers
        or not backend.features.sends_one_message(connection)
    ):
        # Django may ask the server for its version first (MariaDB, a connection's first use): a refusal is typed.
        with translating(alias, nowait=False):
            prefix = backend.tx.statement_settings(connection, lock_timeout=lock, statement_timeout=statement)
        if prefix is None:
            return in_transaction(alias, lock_timeout, work, doing=doing)
        # Each statement carries its own timeouts (MariaDB's SET STATEMENT): the scope sets no session variable.
        with bounded(prefix):
            return cast(T, _operation(alias, None, work, statement_timeout=None, doing=doing)(work))

    def send(message: message_.OneMessage) -> T:
        with message_.sending(message):
            return work()

    return in_messages(
        alias,
        retry_setting(),
        send,
        operation=getattr(work, "__qualname__", "claims"),
        doing=doing,
        timeouts=timeouts,
        elsewhere=lambda: cast(T, _operation(alias, lock_timeout, work, doing=doing)(work)),
        timed=statement is not None,
        resolve=resolve,
    )


def rows_of(model: type[Any]) -> str:
    """What the rows of ``model`` are called, for the log lines: its ``verbose_name_plural`` ("tasks", "jobs")."""
    return str(model._meta.verbose_name_plural)


def retry_setting() -> RetrySetting:
    """The retry setting of a claims call: ``settings.LOCKKIT["RETRY"]`` retrying the ``RETRIED`` kinds, per call."""
    return from_settings(retry_on=RETRIED)


def await_session_end(alias: str, message: Any, lost: ConnectionLost) -> None:
    """Wait until the session a lost claims message went on has ended its transaction (``outcome.await_session_end``).

    For the retry setting's ``reconnect_within`` seconds (``settings.LOCKKIT["RETRY"]``; 5 by default).

    Raises:
        CommitOutcomeUnknown: the session was still in its transaction, or the server unreachable, when time ran out.
    """
    outcome.await_session_end(alias, message.pid, lost, within=reconnect_budget(retry_setting()))


def in_transaction(alias: str, lock_timeout: Any, work: Callable[[], T], *, doing: str) -> T:
    """Run ``work()`` in a locked scope on ``alias``, retried after a failure that rolled it back.

    A connection lost before COMMIT, a deadlock and a serialization failure are retried; a lost COMMIT is resolved
    first. Locks are ``FOR NO KEY UPDATE``; the scope's lock timeout is ``lock_timeout``.

    Args:
        alias: The database alias.
        lock_timeout: Seconds, ``None`` (the connection's own setting) or ``FROM_SETTINGS``.
        work: The claims statement(s) to run in the scope.
        doing: What the call does, in the user's words, for the retry log lines ("claiming tasks").

    Returns:
        What ``work()`` returned.

    Raises:
        TypeError, ValueError: ``lock_timeout`` is not a positive duration, ``None`` or the settings default.
        LockTimeout: a lock was waited for longer than the lock timeout.
        ConnectionLost: the connection was lost (or refused) on every attempt for the setting's ``reconnect_within``
            seconds.
        DeadlockDetected, SerializationFailure: on each attempt ``settings.LOCKKIT["RETRY"]`` allows (3 by default).
        CommitOutcomeUnknown: the connection was lost at COMMIT and the outcome could not be found out.
    """
    operation = _operation(alias, lock_timeout, work, doing=doing)
    return cast(T, operation(work))


def _operation(
    alias: str,
    lock_timeout: Any,
    work: Callable[[], Any],
    statement_timeout: Any = FROM_SETTINGS,
    *,
    doing: str,
) -> Callable[[Callable[[], Any]], Any]:
    """The locked operation that runs a ``work`` callable, decorated once per alias, lock timeout and call site.

    Decorating per call cost more than the scope itself (options validated, a wrapper and its awaitable form
    built). The operation is named after ``work`` (the call site), as the signals report it; its retry log lines
    say ``doing`` (a few descriptions per model, so they can be part of the key). Settings are still
    read per call by the operation itself. A ``lock_timeout`` that cannot be a key (unhashable) is validated
    without being kept, so it raises as always.
    """
    name = getattr(work, "__qualname__", "claims")
    retry = retry_setting()  # the same object until the settings change
    # Keyed by the type too: ``True == 1``, and a bool must still be refused.
    key: Hashable | None = (alias, type(lock_timeout), lock_timeout, statement_timeout, name, doing, retry)
    try:
        return _OPERATIONS[key]
    except KeyError:
        pass
    except TypeError:
        key = None

    def run(work: Callable[[], Any]) -> Any:
        return work()

    run.__qualname__ = name
    run.__name__ = getattr(work, "__name__", "claims")
    run.__module__ = getattr(work, "__module__", __name__)
    # FOR NO KEY UPDATE where the database has it (PostgreSQL); MariaDB/MySQL and SQLite lock their own way.
    no_key = connections[alias].features.has_select_for_no_key_update
    options = ScopeOptions.build(
        using=alias, lock_timeout=lock_timeout, statement_timeout=statement_timeout, no_key=no_key
    )
    operation: Callable[[Callable[[], Any]], Any] = LockedOperation(options, retry, doing=doing)(run)
    if key is not None and len(_OPERATIONS) < _MAX_OPERATIONS:
        _OPERATIONS[key] = operation
    return operation
