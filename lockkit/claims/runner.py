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

import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

from django.db import DatabaseError, connections

from lockkit._engine import message as message_
from lockkit._engine.liveness import discard_after_loss, discard_if_dead
from lockkit._engine.transaction import in_transaction as inside_transaction
from lockkit.backends import backend_for
from lockkit.errorcodes.translate import translating
from lockkit.errors import CommitOutcomeUnknown, ConnectionLost, Failure
from lockkit.operations.operation import locked_operation
from lockkit.operations.retry import RetrySetting, call_with_retry, from_settings, reconnect_budget
from lockkit.scopes.options import ScopeOptions
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
    alias: str, lock_timeout: Any, work: Callable[[], T], resolve: Resolve[T] | None = None
) -> T:
    """Run ``work()`` (one claims statement) as one message with its opening and ``COMMIT``, where it can be.

    Elsewhere (inside the caller's transaction, psycopg2, server-side binding, MariaDB/MySQL, SQLite) it is
    ``in_transaction``. A connection lost before the message was sent, a deadlock and a serialization failure are
    retried; a reply lost after it was sent goes to ``resolve``, which tells from the rows what happened (without
    one, ``CommitOutcomeUnknown``).

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
        return in_transaction(alias, lock_timeout, work)

    def attempt(number: int) -> T:
        discard_if_dead(alias)
        try:
            # Connects if needed: a connection that cannot be opened (every host down or refusing, during a
            # failover) is a ConnectionLost before anything was sent, retried like one.
            with translating(alias, nowait=False, attempts=number):
                message = message_.begin(connection, timeouts)
        except ConnectionLost:
            discard_after_loss(alias)
            raise
        if message is None:  # the connection it made is not in autocommit (a project's own setting)
            return cast(T, _operation(alias, lock_timeout, work)(work))
        try:
            with (
                message_.sending(message),
                translating(alias, nowait=False, attempts=number, timed=statement is not None),
            ):
                return work()
        except ConnectionLost as lost:
            discard_after_loss(alias)
            if not message.sent:
                raise  # nothing reached the server: retried
            if resolve is None:
                raise unknown(alias, lost) from lost
            return resolve(message, lost)

    setting = retry_setting()
    if setting is None:
        return attempt(1)
    return call_with_retry(setting, attempt, alias=alias, operation=getattr(work, "__qualname__", "claims"))


def retry_setting() -> RetrySetting:
    """The retry setting of a claims call: ``settings.LOCKKIT["RETRY"]`` retrying the ``RETRIED`` kinds, per call."""
    return from_settings(retry_on=RETRIED)


def unknown(alias: str, lost: ConnectionLost) -> CommitOutcomeUnknown:
    """The ``CommitOutcomeUnknown`` for a claims call whose reply was lost and whose rows cannot say what it did."""
    return CommitOutcomeUnknown(
        f"the connection to {alias!r} was lost after a claims statement was sent with its COMMIT, and its "
        f"outcome is unknown: {lost}",
        sqlstate=lost.sqlstate,
        alias=alias,
        attempts=lost.attempts,
    )


def await_session_end(alias: str, message: Any, lost: ConnectionLost) -> None:
    """Wait until the server session a lost message went on has ended its transaction, or is gone.

    Asked on a fresh connection (reconnecting through a restart) for up to the retry setting's ``reconnect_within``
    seconds (``settings.LOCKKIT["RETRY"]``; 5 by default), so that the rows read afterwards cannot change behind the
    reader's back: an idle session has committed or rolled back, and a session that no longer exists (terminated,
    or another server after a failover) writes nothing more.

    Raises:
        CommitOutcomeUnknown: the session was still in its transaction, or the server unreachable, when time ran out.
    """
    deadline = time.monotonic() + reconnect_budget(retry_setting())
    pause = _PAUSE
    while True:
        connection = connections[alias]
        try:
            if message.pid is not None and backend_for(connection).sessions.session_ended(
                connection, message.pid
            ):
                return
        except DatabaseError:
            discard_after_loss(alias)  # unreachable for now (a restart): ask again on a fresh connection
        if time.monotonic() + pause > deadline:
            raise unknown(alias, lost) from lost
        time.sleep(pause)
        pause = min(pause * 2, _PAUSE_MAX)


# Pauses between two questions about a lost reply, in seconds (doubling up to the maximum).
_PAUSE = 0.05
_PAUSE_MAX = 0.5


def in_transaction(alias: str, lock_timeout: Any, work: Callable[[], T]) -> T:
    """Run ``work()`` in a locked scope on ``alias``, retried after a failure that rolled it back.

    A connection lost before COMMIT, a deadlock and a serialization failure are retried; a lost COMMIT is resolved
    first. Locks are ``FOR NO KEY UPDATE``; the scope's lock timeout is ``lock_timeout``.

    Args:
        alias: The database alias.
        lock_timeout: Seconds, ``None`` (the connection's own setting) or ``FROM_SETTINGS``.
        work: The claims statement(s) to run in the scope.

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
    operation = _operation(alias, lock_timeout, work)
    return cast(T, operation(work))


def _operation(alias: str, lock_timeout: Any, work: Callable[[], Any]) -> Callable[[Callable[[], Any]], Any]:
    """The locked operation that runs a ``work`` callable, decorated once per alias, lock timeout and call site.

    Decorating per call cost more than the scope itself (options validated, a wrapper and its awaitable form
    built). The operation is named after ``work`` (the call site), as the signals report it. Settings are still
    read per call by the operation itself. A ``lock_timeout`` that cannot be a key (unhashable) is validated
    without being kept, so it raises as always.
    """
    name = getattr(work, "__qualname__", "claims")
    retry = retry_setting()  # the same object until the settings change
    # Keyed by the type too: ``True == 1``, and a bool must still be refused.
    key: Hashable | None = (alias, type(lock_timeout), lock_timeout, name, retry)
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
    operation: Callable[[Callable[[], Any]], Any] = locked_operation(
        using=alias, lock_timeout=lock_timeout, no_key=no_key, retry=retry
    )(run)
    if key is not None and len(_OPERATIONS) < _MAX_OPERATIONS:
        _OPERATIONS[key] = operation
    return operation
