"""A transaction of lockkit's own statements in one message: ``BEGIN; SELECT set_config(...); <statement>; COMMIT``.

lockkit writes the whole text of its own statements (claims, ``guarded_update``, ``locked_update``), so outside a
caller's transaction it sends the
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
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from django.db import DatabaseError

from lockkit import cancellation
from lockkit._engine import prepared
from lockkit.backends import TimeoutToken, backend_for
from lockkit.backends.postgresql.opening import begin_statement, opening_select
from lockkit.errorcodes.table import code_of

#: A row of a statement's result, keyed by column name.
Row = dict[str, Any]

try:
    import psycopg
    from psycopg import pq
except ImportError:  # pragma: no cover - psycopg2-only installations never send one message
    psycopg = None  # type: ignore[assignment]


class OneMessage:
    """A transaction of lockkit's own statements, sent with its opening: one message, or two with a decision between.

    ``run()`` sends ``BEGIN; SELECT set_config(...); <statement>; COMMIT`` (claims, ``guarded_update``): one round
    trip. ``run(..., commit=False)`` sends the opening and a statement and leaves the transaction open (the locking
    ``SELECT`` of ``locked_update``); ``finish()`` then sends ``<statement>; COMMIT`` and ``roll_back()`` ends it.
    With ``columns`` (the backend's opening columns: the transaction id, the server) the opening reads them into
    ``opened``, so a lost ``COMMIT`` reply can be resolved by transaction id.

    Attributes:
        sent: A message carrying the ``COMMIT`` has been handed to the driver (a lost reply is then ambiguous).
        done: Its reply was read: the transaction committed.
        pid: The server session the message was sent on.
        sent_at: ``time.monotonic()`` right before it was sent.
        opened: The values of ``columns``, as text, once the opening ran.
        xid, server: The transaction's id and the server that assigned it (from ``opened``), for resolving a lost
            ``COMMIT`` reply by transaction id (``lockkit._engine.outcome``).
    """

    def __init__(
        self, timeouts: Mapping[str, int], columns: tuple[str, ...] = (), begin: str = "BEGIN"
    ) -> None:
        """Prepare the message's opening: ``begin`` (with the connection's isolation level), then ``timeouts``.

        ``timeouts`` are lockkit's setting names, in whole milliseconds.
        """
        items = tuple(timeouts.items())
        selected = opening_select(items, columns)
        self._prefix = f"{begin}; " + (f"{selected}; " if selected else "")
        self._skip = 2 if selected else 1  # the results before the statement's: BEGIN's, the opening SELECT's
        self._columns = len(columns)
        self.sent = False
        self.pid: int | None = None
        self.sent_at = 0.0
        self.opened: tuple[str | None, ...] = ()
        self.done = False
        self.xid: int | None = None  # the transaction's id and server, read by an opening with ``columns``
        self.server: Any = None

    def run(self, cursor: Any, sql: str, params: Any, *, commit: bool = True) -> tuple[list[Row], int]:
        """Send the opening and ``sql`` through ``cursor`` (Django's), with ``COMMIT`` unless ``commit=False``.

        Returns:
            The statement's rows (keyed by column name) and its row count.

        Raises:
            lockkit.cancellation.CallCancelled: an awaiting caller was cancelled before a ``COMMIT`` was sent.
            django.db.DatabaseError: a statement failed; the transaction is rolled back.
        """
        driver = cursor.cursor
        raw = driver.connection
        self.pid = raw.info.backend_pid
        carried = _CARRIED.get() if commit else None
        statements = [(sql, params)]
        if carried is not None:  # the carried statement first, in the same transaction
            statements.insert(0, (carried.sql, carried.params))
            carried.sends += 1
        self._send(cursor, statements, commit, self._prefix, idle=True)
        driver.nextset()  # past BEGIN's result
        if self._skip == 2:
            if self._columns:
                row = driver.fetchone()
                values = () if row is None else row[len(row) - self._columns :]
                self.opened = tuple(None if value is None else str(value) for value in values)
                tx = backend_for(cursor.db).tx
                tx.remember_server(cursor.db, self.opened)
                self.xid = tx.transaction_id(TimeoutToken({}, self.opened))
                self.server = tx.transaction_server(cursor.db)
            driver.nextset()
        if carried is not None:
            carried.rows = read_rows(driver, carried.sql)[0]
            driver.nextset()
        return read_rows(driver, sql)

    def finish(self, cursor: Any, sql: str, params: Any) -> tuple[list[Row], int]:
        """Send ``<sql>; COMMIT`` in the transaction ``run(..., commit=False)`` opened; return ``sql``'s rows.

        Raises:
            lockkit.cancellation.CallCancelled: an awaiting caller was cancelled before it was sent.
            django.db.DatabaseError: ``sql`` failed (the server skipped the ``COMMIT``); rolled back.
        """
        self._send(cursor, [(sql, params)], True, "", idle=False)
        return read_rows(cursor.cursor, sql)

    def roll_back(self, cursor: Any) -> None:
        """End the open transaction without committing (the decision between two messages was not to write)."""
        _roll_back(cursor.cursor.connection)

    def _send(
        self,
        cursor: Any,
        statements: list[tuple[str, Any]],
        commit: bool,
        prefix: str,
        *,
        idle: bool,
    ) -> None:
        """Send ``prefix``, ``statements`` and ``COMMIT`` (with ``commit``) as one message; roll back on error.

        A statement the session has prepared (``prepared``) goes as its ``EXECUTE``; a message refused because
        the session no longer has it went nowhere (rolled back) and is sent once more as text.
        """
        raw = cursor.cursor.connection
        params = [value for _, values in statements for value in values]
        suffix = "; COMMIT" if commit else ""
        texts = prepared.forms(cursor, statements, idle=idle)
        text = prefix + "; ".join(texts) + suffix
        if commit:
            waiting = cancellation.current()
            if waiting is not None and not waiting.begin_commit():  # the message carries the COMMIT
                _roll_back(raw)
                raise cancellation.CallCancelled(
                    "the awaiting caller was cancelled before the COMMIT was sent"
                )
            self.sent_at = time.monotonic()
            self.sent = True
        try:
            cursor.execute(text, params)
        except DatabaseError as error:
            _roll_back(raw)
            # Sent again only a message that opened its own transaction: ``finish()``'s ran in one now rolled back.
            plain = texts == [sql for sql, _ in statements]
            if plain or not prefix or not prepared.refused(cursor, code_of(error)):
                raise
            try:  # refused before it did anything: once more as text
                cursor.execute(prefix + "; ".join(sql for sql, _ in statements) + suffix, params)
            except BaseException:
                _roll_back(raw)
                raise
        except BaseException:
            _roll_back(raw)
            raise
        self.done = commit  # the COMMIT's reply was read: the transaction committed


def idle(connection: Any) -> bool:
    """Whether ``connection``'s driver connection is open and idle: no statement in flight, no transaction open."""
    raw = connection.connection
    if psycopg is None or not isinstance(raw, psycopg.Connection) or raw.closed or raw.broken:
        return False
    return bool(raw.info.transaction_status == pq.TransactionStatus.IDLE)


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
    message of several statements). Connects if needed (the call is about to). A connection the server ended
    while idle was discarded just before (``liveness.discard_if_dead``, run by every attempt).
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


def begin(connection: Any, timeouts: Mapping[str, int], columns: tuple[str, ...] = ()) -> OneMessage | None:
    """The message a call of lockkit's own outside any transaction sends its statement in, or ``None``.

    ``None`` when the connection is not psycopg 3 idle in autocommit with client-side binding (``can_send``): the
    call then runs in a scope of its own. ``timeouts`` are lockkit's setting names in whole milliseconds. Connects
    if needed.
    """
    if not can_send(connection):
        return None
    # The connection's isolation level and access mode (OPTIONS["isolation_level"]), as psycopg's own BEGIN.
    return OneMessage(timeouts, columns, begin_statement(connection.connection))


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


class Carried:
    """A statement of lockkit's own sent ahead of the next one-message statement, in its transaction (``carrying``).

    Attributes:
        sql, params: The statement and its values.
        sends: How many messages carried it (more than one: an earlier one's reply was lost, or it was retried).
        rows: Its rows (keyed by column name) from the last message whose reply was read, else ``None``.
    """

    def __init__(self, sql: str, params: Sequence[Any]) -> None:
        """Carry ``sql`` with ``params`` (nothing is sent here)."""
        self.sql = sql
        self.params = list(params)
        self.sends = 0
        self.rows: list[Row] | None = None


_CARRIED: ContextVar[Carried | None] = ContextVar("lockkit_carried_statement", default=None)


@contextlib.contextmanager
def carrying(sql: str, params: Sequence[Any]) -> Iterator[Carried]:
    """Send ``sql`` ahead of the statement of each message carrying a ``COMMIT`` sent in the block, in its transaction.

    ``BEGIN; SELECT set_config(...); <sql>; <statement>; COMMIT``: both commit together or neither does. A block
    that sends no such message (another vendor, inside the caller's transaction) leaves ``sends`` at 0: nothing
    of ``sql`` ran.
    """
    carried = Carried(sql, params)
    token = _CARRIED.set(carried)
    try:
        yield carried
    finally:
        _CARRIED.reset(token)


def read_rows(result: Any, statement: str | None = None) -> tuple[list[Row], int]:
    """The rows of the driver cursor ``result`` keyed by column name, and its row count.

    Read from the driver's cursor, which holds the whole result by now: Django's cursor wrapper would build a new
    error-wrapping function for each attribute read, which costs as much as parsing the rows. ``statement``: the
    text of lockkit's own statement that produced the result, whose column names are then read once (they are
    those its text gives: lockkit's statements name every column they return).
    """
    names = _column_names(result) if statement is None else _names_of(result, statement)
    if names is None:
        return [], result.rowcount
    return [dict(zip(names, row, strict=True)) for row in result.fetchall()], result.rowcount


#: Column names per statement text (``_names_of``): a worker reads the same two results for every task, and
#: reading 25 names from a result costs about a fifth of its rows' parsing.
_NAMES: dict[str, list[str]] = {}
_NAMES_KEPT = 256


def _names_of(result: Any, statement: str) -> list[str] | None:
    """``_column_names(result)``, kept per ``statement`` when they are ASCII (the same in any client encoding).

    psycopg 3 only: another driver's names come from ``description``, which cannot tell a result of the same shape.
    """
    if psycopg is None or not isinstance(result, psycopg.Cursor):
        return _column_names(result)
    kept = _NAMES.get(statement)
    if kept is not None:
        pgresult = result.pgresult
        if pgresult is not None and pgresult.nfields == len(kept) and pgresult.status in _TUPLES:
            return kept
    names = _column_names(result)
    if names is not None and all(name.isascii() for name in names):
        if len(_NAMES) >= _NAMES_KEPT:
            _NAMES.clear()
        _NAMES[statement] = names
    return names


def _column_names(result: Any) -> list[str] | None:
    """The current result's column names, or ``None`` where ``description`` is ``None`` (no rows to read).

    On psycopg 3 they are read from its documented ``pgresult`` (``fname()``, decoded in the connection's
    encoding): ``description`` builds a ``Column`` object per column and call, about 1 microsecond each, twice
    per task in a worker's message. Other drivers: ``description``.
    """
    pgresult = encoding = None
    if psycopg is not None and isinstance(result, psycopg.Cursor):
        pgresult = result.pgresult
        # The connection may have ended since (psycopg before 3.3 reads the encoding from the session).
        with contextlib.suppress(psycopg.Error):
            encoding = result.connection.info.encoding
    if pgresult is None or encoding is None:
        description = result.description
        return None if description is None else [column[0] for column in description]
    if not pgresult.nfields and pgresult.status not in _TUPLES:
        return None
    return [bytes(pgresult.fname(index) or b"").decode(encoding) for index in range(pgresult.nfields)]


#: The result statuses that carry rows (psycopg's ``description`` is a list for them even without columns);
#: ``TUPLES_CHUNK`` exists from psycopg 3.2.
_TUPLES = (
    frozenset(
        getattr(pq.ExecStatus, name)
        for name in ("TUPLES_OK", "SINGLE_TUPLE", "TUPLES_CHUNK")
        if hasattr(pq.ExecStatus, name)
    )
    if psycopg is not None
    else frozenset()
)
