"""Opening a transaction and applying its timeouts in one round trip, on psycopg 3.

psycopg starts a transaction by sending ``BEGIN`` on its own and waiting for the reply before the first statement,
so a ``set_config`` right after it costs a second round trip (hand-written ``SET LOCAL`` pays it too). When a
lockkit scope opens the transaction, it sends ``BEGIN; SELECT set_config(...)`` as one simple-query message instead
(libpq's ``PQexec``); psycopg then sees a transaction in progress and sends no ``BEGIN`` of its own. The settings
stay transaction-scoped (``is_local = true``). See
https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-MULTI-STATEMENT.

A claims call goes one step further (``opening_deferred``, set by the claims runner, whose transaction runs only
lockkit's own statements): its scope sends nothing when it begins, and its first statement carries the opening in
the same message, ``BEGIN; SELECT set_config(...), pg_current_xact_id()::text; <statement>``. The statement's
values stay parameters up to the driver: psycopg's client-side cursor (Django's default) binds them as it does for
any statement. psycopg sends no ``BEGIN`` of its own for that message: its ``autocommit`` flag is set while the
connection is idle, right before the message is sent, and stays set until the claims call's short transaction ends.
The transaction id arrives with the statement's reply, before COMMIT is sent, so a lost COMMIT is still resolved.
This is not done for the scopes of user code: there, Django reads psycopg's ``autocommit`` flag (server-side
cursors are then declared ``WITH HOLD``), and statements that bypass Django's execute wrappers (``cursor.copy()``,
the raw driver connection) would run before the opening.

The opening has no parameters (a message of several statements cannot bind them on the server), so this is the
one place where lockkit writes values into SQL text, under a narrow rule: a value is an ``int`` number of
milliseconds that lockkit computed itself from a validated duration, formatted with ``%d``; a name is one of
lockkit's own setting names; an extra column is one of the backend's own constant expressions. Nothing that came
from a user as text ever reaches it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

try:
    import psycopg
    from psycopg import pq
except ImportError:  # pragma: no cover - psycopg2-only installations keep the two-round-trip path
    psycopg = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

#: The only setting names that may be written into the statement.
SETTING_NAMES = frozenset({"lock_timeout", "statement_timeout"})
#: PostgreSQL stores these timeouts as a 32-bit count of milliseconds.
_MAX_MS = 2_147_483_647


def set_config_literal(name: str, milliseconds: int) -> str:
    """``set_config('<name>', '<n>ms', true)`` for one of lockkit's setting names and an ``int`` of milliseconds.

    Raises:
        ValueError: ``name`` is not one of lockkit's setting names, or ``milliseconds`` is out of range.
        TypeError: ``milliseconds`` is not an ``int`` (a ``bool``, a ``float`` or a string never is).
    """
    if name not in SETTING_NAMES:
        raise ValueError(f"name must be one of {sorted(SETTING_NAMES)}, got {name!r}")
    if type(milliseconds) is not int:
        raise TypeError(f"milliseconds must be an int, not {type(milliseconds).__name__}")
    if not 0 < milliseconds <= _MAX_MS:
        raise ValueError(f"milliseconds must be between 1 and {_MAX_MS}, got {milliseconds}")
    # %d, as the rule asks: with the int checked above it can only write digits.
    return "set_config('%s', '%dms', true)" % (name, milliseconds)  # noqa: UP031


def foldable(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` is a psycopg 3 connection about to send its own ``BEGIN`` (so the fold can replace it).

    Not with psycopg2, in autocommit, when a transaction is already open (autocommit turned off by hand and a
    statement run) or in pipeline mode; the caller then sends its settings as a separate, parameterised statement.
    """
    if psycopg is None:  # pragma: no cover - psycopg2-only installations
        return False
    raw = connection.connection
    return (
        isinstance(raw, psycopg.Connection)
        and not raw.autocommit
        and raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
        and raw.pgconn.pipeline_status == pq.PipelineStatus.OFF
    )


def begin_with_settings(
    connection: BaseDatabaseWrapper, timeouts: Mapping[str, int], columns: Sequence[str]
) -> tuple[Any, ...]:
    """Begin ``connection``'s transaction with ``timeouts`` (milliseconds) applied locally, in one round trip.

    Call only when ``foldable(connection)``, right after an outermost ``atomic()`` was entered. Also selects
    ``columns`` (constant SQL expressions of lockkit's own, e.g. ``pg_current_xact_id()``) in the same statement and
    returns their values, in order.

    Raises:
        TypeError, ValueError: as ``set_config_literal`` (an invariant: callers pass lockkit's own values).
        django.db.DatabaseError: as for any statement (the driver's error, wrapped by Django).
    """
    raw = connection.connection
    sql = _folded_sql(_begin_statement(raw), tuple(timeouts.items()), tuple(columns))
    connection.validate_thread_sharing()
    # Through Django's cursor wrapper, so execute_wrapper() hooks, connection.queries and Django's error wrapping
    # (DatabaseError, marking a broken connection unusable) see this statement like any other.
    # Django's stubs type the argument as a CursorWrapper; at run time it is any DB-API cursor (the driver's).
    cursor: Any = _SimpleQueryCursor(raw, first_column=len(timeouts))
    wrapped = (
        connection.make_debug_cursor(cursor) if connection.queries_logged else connection.make_cursor(cursor)
    )
    wrapped.execute(sql)
    row: tuple[Any, ...] = cursor.row
    return row


@functools.lru_cache(maxsize=256)
def _folded_sql(begin: str, timeouts: tuple[tuple[str, int], ...], columns: tuple[str, ...]) -> str:
    """``BEGIN ...; SELECT set_config(...), ..., <columns>``, built once per distinct set of values."""
    selected = [set_config_literal(name, ms) for name, ms in timeouts] + list(columns)
    return f"{begin}; SELECT {', '.join(selected)}"


def _begin_statement(raw: psycopg.Connection[Any]) -> str:
    """The ``BEGIN`` psycopg would send, with the connection's isolation level and access mode."""
    parts = ["BEGIN"]
    if raw.isolation_level is not None:
        parts.append("ISOLATION LEVEL " + psycopg.IsolationLevel(raw.isolation_level).name.replace("_", " "))
    if raw.read_only is not None:
        parts.append("READ ONLY" if raw.read_only else "READ WRITE")
    if raw.deferrable is not None:
        parts.append("DEFERRABLE" if raw.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


class _SimpleQueryCursor:
    """The part of a DB-API cursor Django's ``CursorWrapper`` uses, sending one simple-query message through libpq."""

    def __init__(self, raw: psycopg.Connection[Any], first_column: int = 0) -> None:
        self._raw = raw
        self._first_column = first_column  # the columns before it (set_config's results) are not read
        self.rowcount = -1
        self.row: tuple[Any, ...] = ()
        # Django's debug log (connection.queries) reads the last statement from psycopg's ``cursor._query.query``.
        self._query: Any = None

    def execute(self, sql: str, params: object = None) -> None:
        if params is not None:  # pragma: no cover - invariant: the statement is built without parameters
            raise TypeError("the folded BEGIN takes no parameters")
        encoding = self._raw.info.encoding
        statement = sql.encode(encoding)
        self._query = SimpleNamespace(query=statement)
        with self._raw.lock:
            result = self._raw.pgconn.exec_(statement)
        if result.status == pq.ExecStatus.TUPLES_OK:
            # PQexec returns the last statement's result: the SELECT's one row, read as text.
            self.row = tuple(
                None if value is None else value.decode(encoding)
                for value in (
                    result.get_value(0, column) for column in range(self._first_column, result.nfields)
                )
            )
            self.rowcount = result.ntuples
            return
        if self._raw.pgconn.status == pq.ConnStatus.BAD or not result.error_field(
            pq.DiagnosticField.SQLSTATE
        ):
            # As psycopg reports a lost connection: an OperationalError, so Django marks the connection unusable.
            raise psycopg.OperationalError(result.get_error_message(encoding) or "the connection was lost")
        raise psycopg.errors.error_from_result(result, encoding=encoding)

    def close(self) -> None:
        """Nothing to release: no server-side or client-side state is kept."""


# -- the opening deferred to the first statement of a claims call --------------------------------------------------

_DEFERRING: contextvars.ContextVar[bool] = contextvars.ContextVar("lockkit_opening_deferred", default=False)


@contextlib.contextmanager
def opening_deferred() -> Iterator[None]:
    """In the block (a claims call), an outermost psycopg 3 scope defers its opening to its first statement."""
    token = _DEFERRING.set(True)
    try:
        yield
    finally:
        _DEFERRING.reset(token)


def deferrable(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection``'s opening can ride on the first statement: in a claims call, on a client-side cursor.

    Call after ``foldable``. psycopg's client-side cursor (Django's default) sends a statement as a simple query,
    so the opening can precede it in the same message.
    """
    if not _DEFERRING.get():
        return False
    factory = getattr(connection.connection, "cursor_factory", None)
    return isinstance(factory, type) and issubclass(factory, psycopg.ClientCursor)


class PendingOpening:
    """A claims call's opening, not sent yet: the call's first statement carries it (an execute wrapper).

    Attributes:
        opened: The values of the opening columns (as text), once the opening ran; empty before.
    """

    def __init__(self, connection: BaseDatabaseWrapper, timeouts: Mapping[str, int], columns: Sequence[str]):
        """Defer the opening of ``connection``'s transaction until its first statement."""
        self.connection = connection
        self.timeouts = dict(timeouts)
        self.columns = tuple(columns)
        self.opened: tuple[str | None, ...] = ()
        self._pending = False
        self._guard: Callable[..., Any] = self.carry  # one bound method, removed by identity
        self._arm()

    def _arm(self) -> None:
        self._pending = True
        # Innermost: a statement that another execute wrapper runs on its own is itself the first statement, and
        # carries the opening; psycopg's autocommit flag is set only right before the message goes out.
        self.connection.execute_wrappers.append(self._guard)

    def carry(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        """A Django execute wrapper: send the opening with the first statement, in one message.

        ``BEGIN; SELECT set_config(...), <opening columns>; <statement>`` goes as one simple query (psycopg's
        client-side cursor binds the statement's parameters, as it does for any statement). psycopg sends no
        ``BEGIN`` of its own for it: its ``autocommit`` flag is on while the connection is idle, and stays on
        until the transaction ends (psycopg's ``commit()``/``rollback()`` end it all the same), since psycopg
        refuses to change the flag inside a transaction. An ``executemany`` gets the opening on its own first.
        """
        if not self._take():
            return execute(sql, params, many, context)
        cursor = getattr(context.get("cursor"), "cursor", None)
        raw = self.connection.connection
        if many or not isinstance(cursor, psycopg.ClientCursor) or not foldable(self.connection):
            self.opened = begin_with_settings(self.connection, self.timeouts, self.columns)
            return execute(sql, params, many, context)
        opening = _folded_sql(_begin_statement(raw), tuple(self.timeouts.items()), self.columns)
        raw.autocommit = True  # idle: allowed, sends nothing
        try:
            result = execute(f"{opening}; {sql}", params, many, context)
        finally:
            if not raw.closed and raw.pgconn.transaction_status == pq.TransactionStatus.IDLE:
                # Nothing began: the statement failed before it was sent (psycopg could not adapt a value).
                # The next statement carries the opening instead.
                raw.autocommit = False
                self._arm()
        cursor.nextset()  # from BEGIN's result to the opening's row
        row = cursor.fetchone()
        self.opened = tuple(None if v is None else str(v) for v in (row or ())[len(self.timeouts) :])
        cursor.nextset()  # to the statement's own result, where Django reads it
        return result

    def _take(self) -> bool:
        """Stop guarding; return whether the opening was still pending (the caller now sends it)."""
        if not self._pending:
            return False
        self._pending = False
        wrappers = self.connection.execute_wrappers
        for index in range(len(wrappers) - 1, -1, -1):
            if wrappers[index] is self._guard:
                del wrappers[index]
                break
        return True

    def cancel(self) -> None:
        """The scope ended without a statement: nothing was sent, nothing to send."""
        self._take()
