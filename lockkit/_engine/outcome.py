"""What became of a transaction whose ``COMMIT`` reply was lost: committed, rolled back, or unknown.

The one place lockkit decides a lost outcome by transaction id (``of_transaction``: PostgreSQL's ``pg_xact_status``,
asked only of the same server and timeline) and says so when it cannot (``unknown``). Claims calls, whose
statements say in their rows what they did, decide theirs from the rows once the session that sent them has ended
(``await_session_end``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import DatabaseError, connections

from lockkit._engine.liveness import discard_after_loss
from lockkit.backends import backend_for
from lockkit.errors import CommitOutcomeUnknown, ConnectionLost

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


def await_session_end(alias: str, pid: int | None, lost: ConnectionLost, *, within: float) -> None:
    """Wait until server session ``pid`` (which a lost message went on) has ended its transaction, or is gone.

    Asked on a fresh connection (reconnecting through a restart) for up to ``within`` seconds, so that the rows read
    afterwards cannot change behind the reader's back: an idle session has committed or rolled back, and a session
    that no longer exists (terminated, or another server after a failover) writes nothing more.

    Raises:
        CommitOutcomeUnknown: the session was still in its transaction, or the server unreachable, when time ran out.
    """
    deadline = time.monotonic() + within
    pause = _PAUSE
    while True:
        connection = connections[alias]
        try:
            if pid is not None and backend_for(connection).sessions.session_ended(connection, pid):
                return
        except DatabaseError:
            discard_after_loss(alias)  # unreachable for now (a restart): ask again on a fresh connection
        if time.monotonic() + pause > deadline:
            raise unknown(alias, lost, what="a message carrying its COMMIT") from lost
        time.sleep(pause)
        pause = min(pause * 2, _PAUSE_MAX)
