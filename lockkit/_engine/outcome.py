"""What became of a transaction whose ``COMMIT`` reply was lost: committed, rolled back, or unknown.

The one place lockkit decides a lost outcome by transaction id (``of_transaction``: PostgreSQL's ``pg_xact_status``,
asked only of the same server and timeline) and says so when it cannot (``unknown``). Claims calls, whose
statements say in their rows what they did, decide theirs from the rows once the session that sent them has ended
(``await_session_end``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, NoReturn

from django.db import DatabaseError, Error, connections

from lockkit._engine.callbacks import Callbacks
from lockkit._engine.failures import driver_errors
from lockkit._engine.liveness import discard_after_loss
from lockkit.backends import backend_for
from lockkit.errorcodes.table import chain
from lockkit.errors import CommitOutcomeUnknown, ConnectionLost, OnCommitError

logger = logging.getLogger("lockkit")

# Pauses between two questions about a lost reply, in seconds (doubling up to the maximum).
_PAUSE = 0.05
_PAUSE_MAX = 0.5


def unknown(
    alias: str, lost: ConnectionLost, *, xid: int | None = None, what: str = "COMMIT"
) -> CommitOutcomeUnknown:
    """The ``CommitOutcomeUnknown`` for a ``COMMIT`` (or a message carrying one) whose reply was lost."""
    cause = lost.__cause__ if lost.__cause__ is not None else lost
    said = "" if xid is None else f" (transaction id {xid})"
    return CommitOutcomeUnknown(
        f"the connection to {alias!r} was lost while {what} was in flight and its outcome is unknown{said}: the "
        f"work may have committed; check before doing it again: {cause}",
        sqlstate=lost.sqlstate,
        alias=alias,
        attempts=lost.attempts,
        xid=xid,
    )


def of_transaction(alias: str, xid: int | None, server: Any, lost: ConnectionLost, *, within: float) -> None:
    """Return when transaction ``xid`` committed; raise ``lost`` when it rolled back, else ``CommitOutcomeUnknown``.

    Asked of the server that ran it (``server``: the backend's ``transaction_server``), reconnecting for up to
    ``within`` seconds. The alias's connection is discarded unless the answer is "committed" on a fresh one.

    Raises:
        ConnectionLost: ``lost``, the transaction rolled back (nothing changed; retryable).
        CommitOutcomeUnknown: the server could not say (another server or timeline, unreachable, no id).
    """
    connection = connections[alias]
    decided = backend_for(connection).tx.commit_outcome(connection, xid, within=within, server=server)
    cause = lost.__cause__ if lost.__cause__ is not None else lost
    if decided == "committed":
        logger.info("lockkit: the reply to COMMIT on %r was lost; transaction %s committed", alias, xid)
        return
    discard_after_loss(alias)
    if decided == "aborted":
        raise lost from cause
    raise unknown(alias, lost, xid=xid) from cause


def committed_unread(alias: str, lost: ConnectionLost, xid: int | None) -> CommitOutcomeUnknown:
    """A message whose transaction committed but whose reply (the statement's rows) was lost: the work is done.

    Raised as ``CommitOutcomeUnknown`` because the caller cannot be given what the call returns; the message says
    that the transaction committed, so the work must not be done again.
    """
    return CommitOutcomeUnknown(
        f"the reply to a message carrying its COMMIT on {alias!r} was lost; transaction {xid} COMMITTED, but what "
        "it returned (its rows) was lost with the reply: the work is done, do not do it again",
        sqlstate=lost.sqlstate,
        alias=alias,
        attempts=lost.attempts,
        xid=xid,
    )


def await_session_end(
    alias: str,
    pid: int | None,
    lost: ConnectionLost,
    *,
    within: float,
    what: str = "a message carrying its COMMIT",
) -> None:
    """Wait until server session ``pid`` (which a lost message went on) has ended its transaction, or is gone.

    Asked on a fresh connection (reconnecting through a restart) for up to ``within`` seconds, so that the rows read
    afterwards cannot change behind the reader's back: an idle session has committed or rolled back, and a session
    that no longer exists (terminated, or another server after a failover) writes nothing more.

    Raises:
        CommitOutcomeUnknown: the session was still in its transaction, or the server unreachable, when time ran
            out; at once when no session can be named (``pid`` is ``None``, or it is a pooler's id, not a server
            session's: ``session_ended`` says ``None``). ``what`` names what was in flight.
    """
    deadline = time.monotonic() + within
    pause = _PAUSE
    while True:
        connection = connections[alias]
        if pid is None:
            raise unknown(alias, lost, what=what) from lost
        try:
            ended = backend_for(connection).sessions.session_ended(connection, pid)
        except DatabaseError:
            discard_after_loss(alias)  # unreachable for now (a restart): ask again on a fresh connection
            ended = False
        if ended is None:
            raise unknown(alias, lost, what=what) from lost
        if ended:
            return
        if time.monotonic() + pause > deadline:
            raise unknown(alias, lost, what=what) from lost
        time.sleep(pause)
        pause = min(pause * 2, _PAUSE_MAX)


# SQLSTATE statement_completion_unknown: CockroachDB's "result is ambiguous" when a COMMIT's fate is unknown.
AMBIGUOUS_COMMIT = "40003"


def ambiguous(alias: str, commit_exc: BaseException, xid: int | None) -> CommitOutcomeUnknown:
    """SQLSTATE 40003 at COMMIT (CockroachDB's "result is ambiguous"): it may or may not have committed."""
    return CommitOutcomeUnknown(
        f"the COMMIT on {alias!r} reported statement_completion_unknown (SQLSTATE 40003): the transaction may or "
        f"may not have committed: {commit_exc}",
        sqlstate=AMBIGUOUS_COMMIT,
        alias=alias,
        xid=xid,
    )


def after_interrupt(
    alias: str,
    commit_exc: BaseException,
    xid: int | None,
    server: Any,
    callbacks: Callbacks,
    *,
    within: float,
) -> NoReturn:
    """An exception interrupted the wait for COMMIT's reply (a cancel request was just sent): find the outcome.

    The connection is discarded (its driver is mid-reply, and Django's next statement on it would fail), then the
    server that had the transaction is asked what became of it. Rolled back (the cancel stopped a deferred trigger,
    or the COMMIT never took effect): the interrupt is raised, nothing changed. Committed: lockkit's recorded
    callbacks run, then the interrupt is raised with a note saying so. Otherwise ``CommitOutcomeUnknown``, raised
    from the interrupt.
    """
    connection = connections[alias]
    errors = driver_errors(connection)
    interrupt = next((link for link in chain(commit_exc) if not isinstance(link, errors)), commit_exc)
    logger.warning(
        "lockkit: %s interrupted the COMMIT on %r; the connection is discarded and transaction %s resolved",
        type(interrupt).__name__,
        alias,
        xid,
    )
    with contextlib.suppress(Error):
        connection.close()
    decided = backend_for(connection).tx.commit_outcome(connections[alias], xid, within=within, server=server)
    discard_after_loss(alias)
    if decided == "aborted":
        raise interrupt
    if decided == "committed":
        callbacks.run_pending(lambda error: on_commit_error(alias, error))
        interrupt.add_note(
            f"lockkit: transaction {xid} on {alias!r} committed before this interrupted its COMMIT; its on_commit "
            "callbacks ran: do not do the work again"
        )
        raise interrupt
    raise CommitOutcomeUnknown(
        f"{type(interrupt).__name__} interrupted the COMMIT on {alias!r} and its outcome is unknown (transaction id "
        f"{xid}): the work may have committed; check before doing it again",
        alias=alias,
        xid=xid,
    ) from interrupt


def on_commit_error(alias: str, callback_error: Exception) -> OnCommitError:
    return OnCommitError(
        f"an on_commit callback failed after the transaction on {alias!r} committed "
        f"({type(callback_error).__name__}: {callback_error}); the work is committed: do not retry it",
        alias=alias,
    )
