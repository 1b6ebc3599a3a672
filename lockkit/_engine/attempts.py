"""The one attempt loop of lockkit's own transactions sent as messages: claims, ``guarded_update``, ``locked_update``.

Each attempt discards a dead connection, opens a ``OneMessage`` (connecting: a server that refuses connections is a
``ConnectionLost`` before anything was sent), runs the caller's ``send(message)`` with its errors translated, and
decides a connection lost after a message carrying ``COMMIT`` went: from the rows (the caller's ``resolve``), by
transaction id (``outcome.of_transaction``), or ``CommitOutcomeUnknown``. Failures are retried per the call's retry
setting (``lockkit.retries.call_with_retry``); operations observed through lockkit's signals are reported as
``locked_operation`` calls are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from django.db import connections

from lockkit import events
from lockkit._engine import outcome
from lockkit._engine.liveness import discard_after_loss, discard_if_dead
from lockkit._engine.message import OneMessage, begin
from lockkit.backends import backend_for
from lockkit.errorcodes.translate import translating
from lockkit.errors import ConnectionLost
from lockkit.retries import RetrySetting, call_with_retry, reconnect_budget

T = TypeVar("T")

#: ``resolve(message, lost)``: what a call whose reply was lost did, told from its rows; raises when unknown.
Resolve = Callable[[OneMessage, ConnectionLost], T]


def in_messages(
    alias: str,
    setting: RetrySetting,
    send: Callable[[OneMessage], T],
    *,
    operation: str,
    timeouts: Mapping[str, int],
    elsewhere: Callable[[], T],
    nowait: bool = False,
    timed: bool = False,
    resolve: Resolve[T] | None = None,
    by_xid: bool = False,
    observed_as: object = None,
) -> T:
    """Run ``send(message)`` in a transaction sent as messages on ``alias``, each attempt a fresh one.

    Args:
        alias: The database alias (outside any transaction, on a backend that ``sends_one_message``).
        setting: The call's retry setting (``None``: one attempt).
        send: Sends the statements through the message (``message.run``, ``message.finish``) and returns the result.
        operation: The call's name, for retry events, logs and signals.
        timeouts: lockkit's setting names in whole milliseconds, applied by the opening.
        elsewhere: The same call in a scope, for a connection that turns out not to be idle in autocommit.
        nowait: The locks are taken with ``NOWAIT`` (a 55P03 is ``LockNotAvailable``).
        timed: A ``statement_timeout`` applies (a 57014 is ``StatementTimeout``).
        resolve: Decides a reply lost after ``COMMIT`` was sent (from the rows, or with ``outcome.of_transaction``
            and what ``send`` knew) and returns the call's result or raises.
        by_xid: The opening reads the transaction id and its server (``message.xid``, ``message.server``), so a
            lost reply can be decided by them; without ``resolve`` it then is: committed, rolled back
            (``ConnectionLost``, retried) or unknown. Without either, a lost reply is ``CommitOutcomeUnknown``.
        observed_as: The sender of ``operation_started``/``operation_finished``/attempt signals, or ``None``.

    Raises:
        ConnectionLost: lost before anything that could commit was sent, on every attempt the setting allows; or
            sent and rolled back.
        CommitOutcomeUnknown: a reply lost after ``COMMIT`` was sent, and neither the rows nor the server can say.
        LockError: the database's classified failure, after the setting's attempts.
    """
    connection = connections[alias]
    columns = backend_for(connection).tx.opening_columns(connection) if by_xid else ()

    def attempt(number: int) -> T:
        discard_if_dead(alias)
        try:
            with translating(alias, nowait=nowait, attempts=number):
                message = begin(connection, timeouts, columns)
        except ConnectionLost:
            discard_after_loss(alias)
            raise
        if message is None:  # the connection it made is not in autocommit (a project's own setting)
            return elsewhere()
        try:
            with translating(alias, nowait=nowait, attempts=number, timed=timed):
                return send(message)
        except ConnectionLost as lost:
            discard_after_loss(alias)
            if not message.sent:
                raise  # the COMMIT never left: the server rolls back; retried like any lost connection
            if resolve is not None:
                return resolve(message, lost)
            if not by_xid:
                raise outcome.unknown(alias, lost, what="a message carrying its COMMIT") from lost
            outcome.of_transaction(alias, message.xid, message.server, lost, within=reconnect_budget(setting))
            raise outcome.committed_unread(alias, lost, message.xid) from lost

    if observed_as is None or not events.observing():
        if setting is None:
            return attempt(1)
        return call_with_retry(setting, attempt, alias=alias, operation=operation)
    with events.ObservedOperation(observed_as, operation, alias, lambda error: error) as observed:
        observed_attempt = observed.wrap(lambda _alias, number, _args, _kwargs: attempt(number))
        if setting is None:
            return observed_attempt(alias, 1, (), {})
        return call_with_retry(
            setting, lambda number: observed_attempt(alias, number, (), {}), alias=alias, operation=operation
        )
