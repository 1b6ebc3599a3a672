"""The one attempt loop of lockkit's own transactions sent as messages: claims, ``guarded_update``, ``locked_update``.

Each attempt discards a dead connection (and, after it, one that met a read-only server), opens a ``OneMessage`` (connecting: a server that refuses connections is a
``ConnectionLost`` before anything was sent), runs the caller's ``send(message)`` with its errors translated, and
decides a connection lost after a message carrying ``COMMIT`` went: from the rows (the caller's ``resolve``), by
transaction id (``outcome.of_transaction``), or ``CommitOutcomeUnknown``. An exception that is not the database's (a
signal handler's time limit) cancels the statement in flight on the server and discards the connection, as a
scope does; an awaiting caller's cancellation cancels it too. Failures are retried per the call's retry setting
(``lockkit.retries.call_with_retry``), except an attempt during which work committed on another alias
(``commits``). Operations observed through lockkit's signals are reported as ``locked_operation`` calls are.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import NoReturn, TypeVar

from django.db import Error, connections

from lockkit import cancellation, events
from lockkit._engine import commits, outcome
from lockkit._engine.liveness import discard_after_loss, discard_if_dead, discard_read_only
from lockkit._engine.message import OneMessage, begin, idle
from lockkit.backends import backend_for
from lockkit.errorcodes.translate import translating
from lockkit.errors import CommitOutcomeUnknown, ConnectionLost, LockError, ReadOnlyDatabase
from lockkit.retries import RetrySetting, call_with_retry, reconnect_budget

T = TypeVar("T")

logger = logging.getLogger("lockkit")

#: ``resolve(message, lost)``: what a call whose reply was lost did, told from its rows; raises when unknown.
Resolve = Callable[[OneMessage, ConnectionLost], T]


class _Kept(BaseException):
    """Carries an attempt's error past the retry loop: work committed on another alias during it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def in_messages(
    alias: str,
    setting: RetrySetting,
    send: Callable[[OneMessage], T],
    *,
    operation: str,
    doing: str | None = None,
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
        operation: The call's name, for retry events and signals.
        doing: What the call does, in words, for the retry log lines (default ``operation``).
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
        lockkit.cancellation.CallCancelled: the awaiting caller was cancelled before a ``COMMIT`` was sent.
    """
    connection = connections[alias]
    tx = backend_for(connection).tx
    within = reconnect_budget(setting)

    def lost_after_sending(message: OneMessage, lost: ConnectionLost) -> T:
        if resolve is not None:
            return resolve(message, lost)
        if not by_xid:
            raise outcome.unknown(alias, lost, what="a message carrying its COMMIT") from lost
        outcome.of_transaction(alias, message.xid, message.server, lost, within=within)
        raise outcome.committed_unread(alias, lost, message.xid) from lost

    def attempt(number: int) -> T:
        waiting = cancellation.current()
        if waiting is not None:
            waiting.raise_if_cancelled()  # the caller is gone: no new attempt
        discard_if_dead(alias)
        reused = connection.connection is not None
        # Per attempt: the server's identity is read once per driver connection, and an attempt after a lost
        # one opens on a new connection (found by a review: kept per call, a second loss in one call had no
        # server to ask and was reported unknown).
        columns = tx.opening_columns(connection) if by_xid else ()
        try:
            with translating(alias, nowait=nowait, attempts=number):
                message = begin(connection, timeouts, columns)
        except ConnectionLost:
            discard_after_loss(alias)
            raise
        if message is None:  # the connection it made is not in autocommit (a project's own setting)
            return elsewhere()
        record = commits.Attempt(alias)
        opened = commits.push(record)
        try:
            with (
                _cancellable(alias, waiting),
                translating(alias, nowait=nowait, attempts=number, timed=timed),
            ):
                result = send(message)
        except ConnectionLost as lost:
            discard_after_loss(alias)
            if message.sent:
                result = lost_after_sending(message, lost)  # returns only when it committed
            else:  # the COMMIT never left: rolled back; retried like any lost connection
                _keep_if_committed_elsewhere(lost, record)
                raise
        except (Error, LockError, cancellation.CallCancelled) as failed:
            abandoned = _abandoned(waiting, failed)
            if abandoned is not None:
                raise abandoned from failed
            if isinstance(failed, ReadOnlyDatabase):  # a kept connection on a node that became read-only
                discard_read_only(alias, failed, reused=reused)
            _keep_if_committed_elsewhere(failed, record)
            raise
        except BaseException as interrupt:
            _interrupted(alias, message, interrupt, lost_after_sending)
        finally:
            commits.pop(opened)
        if message.sent:
            commits.committed(alias)  # open attempts on other aliases can no longer be run again
        return result

    def retried() -> T:
        if setting is None:
            return attempt(1)
        return call_with_retry(setting, attempt, alias=alias, operation=operation, doing=doing)

    try:
        if observed_as is None or not events.observing():
            return retried()
        with events.ObservedOperation(observed_as, operation, alias, _unwrap) as observed:
            observed_attempt = observed.wrap(lambda _alias, number, _args, _kwargs: attempt(number))
            if setting is None:
                return observed_attempt(alias, 1, (), {})
            return call_with_retry(
                setting,
                lambda number: observed_attempt(alias, number, (), {}),
                alias=alias,
                operation=operation,
                doing=doing,
            )
    except _Kept as kept:
        raise kept.error from kept.error.__cause__


def _unwrap(error: BaseException) -> BaseException:
    return error.error if isinstance(error, _Kept) else error


def _keep_if_committed_elsewhere(error: BaseException, record: commits.Attempt) -> None:
    """Raise a carrier no retry policy retries when work committed on another alias during the attempt."""
    if record.elsewhere:
        commits.note(error, record.alias, record.elsewhere)
        raise _Kept(error) from error


@contextlib.contextmanager
def _cancellable(alias: str, waiting: cancellation.Cancellation | None) -> Iterator[None]:
    """Let an awaiting caller's cancellation cancel the statement this session runs, for the block's duration."""
    if waiting is None:
        yield
        return
    connection = connections[alias]
    sessions = backend_for(connection).sessions
    session = sessions.local_session_id(connection)
    if session is not None:
        waiting.attach(functools.partial(sessions.cancel_statement, alias, session))
    try:
        yield
    finally:
        if waiting.cancelled:
            waiting.settle()  # the server-side cancel is sent before the session runs anything else
        waiting.attach(None)


def _abandoned(waiting: cancellation.Cancellation | None, failed: BaseException) -> BaseException | None:
    """``CallCancelled`` when the attempt failed because its awaiting caller was cancelled, else ``None``."""
    if (
        waiting is not None
        and waiting.cancelled
        and not waiting.committing
        and not isinstance(failed, cancellation.CallCancelled)
    ):
        return cancellation.CallCancelled("the awaiting caller was cancelled; nothing was committed")
    return None


def _interrupted(
    alias: str,
    message: OneMessage,
    interrupt: BaseException,
    lost_after_sending: Callable[[OneMessage, ConnectionLost], object],
) -> NoReturn:
    """An exception that is not the database's (a signal handler's, or the caller's own) left the message.

    Raised after the ``COMMIT``'s reply was read: it committed, and the exception says so. Raised while nothing
    is in flight and no transaction is open (``change()`` raised and the transaction was rolled back): as it is.

    The statement in flight is cancelled on the server and the connection discarded (its driver may be mid-reply),
    so no lock or transaction outlives the call and the next call reconnects. When a message carrying ``COMMIT``
    had been sent, its outcome is decided as a lost reply's: rolled back (the interrupt is raised), committed (the
    interrupt is raised with a note saying so: do not do the work again), or ``CommitOutcomeUnknown`` from it.
    """
    connection = connections[alias]
    if message.done:
        interrupt.add_note(
            f"lockkit: the transaction on {alias!r} committed before this was raised: do not do the work again"
        )
        raise interrupt
    if not message.sent and idle(connection):
        raise interrupt  # nothing in flight, the transaction ended (rolled back): the connection is usable
    if backend_for(connection).tx.cancel_in_flight(connection):
        logger.warning(
            "lockkit: %s interrupted a statement on %r; it was cancelled on the server and the connection is "
            "discarded",
            type(interrupt).__name__,
            alias,
        )
    with contextlib.suppress(Error):
        connection.close()
    if not message.sent:
        raise interrupt
    lost = ConnectionLost(
        f"{type(interrupt).__name__} interrupted the reply to a message carrying its COMMIT on {alias!r}",
        alias=alias,
    )
    try:
        lost_after_sending(message, lost)
    except ConnectionLost:
        raise interrupt from None  # rolled back: nothing changed
    except CommitOutcomeUnknown as unknown:
        raise unknown from interrupt
    interrupt.add_note(
        f"lockkit: the transaction on {alias!r} committed before this interrupted it: do not do the work again"
    )
    raise interrupt
