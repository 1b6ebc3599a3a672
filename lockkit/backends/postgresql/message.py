"""A claims call in one round trip: ``BEGIN; SELECT set_config(...); <statement>; COMMIT`` as one message.

lockkit writes the whole text of its own claims statements, so outside a caller's transaction it sends the
transaction's opening, the statement and the ``COMMIT`` as one simple-query message through Django's cursor (psycopg's
client-side cursor binds the statement's values, as it does for any statement). The statement runs under the
call's ``lock_timeout`` (``is_local = true``: it ends with the transaction) and nothing else is sent: no transaction
id is taken, so a poll of an empty queue assigns none and flushes no WAL. See
https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-MULTI-STATEMENT.

After an error inside the message the server keeps the transaction block open and aborted; it is rolled back here
before the error leaves, so the connection is idle again. A reply lost after the message was sent is the caller's
to resolve, from the rows themselves (``sent``, ``pid`` and ``sent_at`` say what went and when).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from lockkit import cancellation
from lockkit.backends.postgresql.opening import settings_select
from lockkit.backends.sql.claims import Row, read_rows

try:
    import psycopg
    from psycopg import pq
except ImportError:  # pragma: no cover - psycopg2-only installations never send one message
    psycopg = None  # type: ignore[assignment]


class OneMessage:
    """One claims call's statement, to be sent with its transaction's opening and ``COMMIT``.

    Attributes:
        sent: The message has been handed to the driver (a lost reply is then ambiguous).
        pid: The server session the message was sent on.
        sent_at: ``time.monotonic()`` right before it was sent.
    """

    def __init__(self, timeouts: Mapping[str, int]) -> None:
        """Prepare the message's opening for ``timeouts`` (lockkit's setting names, whole milliseconds)."""
        items = tuple(timeouts.items())
        self._prefix = "BEGIN; " + (f"{settings_select(items)}; " if items else "")
        self._skip = 2 if items else 1  # the results before the statement's: BEGIN's, set_config's
        self.sent = False
        self.pid: int | None = None
        self.sent_at = 0.0

    def run(self, cursor: Any, sql: str, params: Any) -> tuple[list[Row], int]:
        """Send ``sql`` in the message through ``cursor`` (Django's); return its rows and row count.

        Raises:
            django.db.DatabaseError: the statement (or the ``COMMIT``) failed; the transaction is rolled back.
        """
        driver = cursor.cursor
        raw = driver.connection
        self.pid = raw.info.backend_pid
        waiting = cancellation.current()
        if waiting is not None and not waiting.begin_commit():  # the message carries the COMMIT
            raise cancellation.CallCancelled(
                "the awaiting caller was cancelled before the claims call was sent"
            )
        self.sent_at = time.monotonic()
        self.sent = True
        try:
            cursor.execute(f"{self._prefix}{sql}; COMMIT", params)
        except BaseException:
            _roll_back(raw)
            raise
        for _ in range(self._skip):
            driver.nextset()
        return read_rows(driver)


def _roll_back(raw: Any) -> None:
    """End the aborted transaction block an error left open, through the driver's public API."""
    if raw.closed or raw.broken:
        return
    if raw.info.transaction_status in (pq.TransactionStatus.INERROR, pq.TransactionStatus.INTRANS):
        with contextlib.suppress(psycopg.Error):
            raw.execute("ROLLBACK")


def can_send(connection: Any) -> bool:
    """Whether ``connection`` can carry a claims call as one message: psycopg 3, client-side binding, autocommit.

    Client-side binding is read from the driver connection's ``cursor_factory`` (Django's default is psycopg's
    ``ClientCursor``; ``OPTIONS["server_side_binding"]`` makes it the server-binding ``Cursor``, which refuses a
    message of several statements). Connects if needed (the call is about to).
    """
    if psycopg is None:
        return False
    connection.ensure_connection()
    raw = connection.connection
    return (
        isinstance(raw, psycopg.Connection)
        and issubclass(raw.cursor_factory, psycopg.ClientCursor)
        and raw.autocommit
        and raw.info.transaction_status == pq.TransactionStatus.IDLE
    )


_CURRENT: ContextVar[OneMessage | None] = ContextVar("lockkit_claims_message", default=None)


def current() -> OneMessage | None:
    """The message the claims call running in this context sends its statement in, if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def sending(message: OneMessage) -> Iterator[OneMessage]:
    """Send the claims statements run inside the block in ``message`` (one statement per message)."""
    token = _CURRENT.set(message)
    try:
        yield message
    finally:
        _CURRENT.reset(token)
