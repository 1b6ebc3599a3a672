"""An outermost scope's opening in one round trip: ``BEGIN; SELECT set_config(...), <columns>`` as one message.

psycopg starts a transaction by sending ``BEGIN`` on its own and waiting for the reply before the first statement,
so a ``set_config`` right after it costs a second round trip (hand-written ``SET LOCAL`` pays it too). When a
lockkit scope opens the transaction, it sends ``BEGIN; SELECT set_config(...)`` as one simple-query message
instead, through psycopg's documented low-level escape hatch (``Connection.pgconn``, libpq's ``PQexec``); psycopg
then sees a transaction in progress and sends no ``BEGIN`` of its own. The settings stay transaction-scoped
(``is_local = true``), and every later way into the driver (``cursor.copy()``, the raw connection, its
``transaction()`` and pipelines) runs inside the scope's transaction, because it is open before the body runs. See
https://www.psycopg.org/psycopg3/docs/api/pq.html and
https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-MULTI-STATEMENT.

The opening has no parameters (a message of several statements cannot bind them on the server), so this is one
of the places where lockkit writes values into SQL text, under a narrow rule: a value is an ``int`` number of
milliseconds that lockkit computed itself from a validated duration, formatted with ``%d``; a name is one of
lockkit's own setting names; an extra column is one of the backend's own constant expressions. Nothing that came
from a user as text ever reaches it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

try:
    import psycopg
    from psycopg import pq
except ImportError:  # pragma: no cover - psycopg2-only installations keep the two-round-trip path
    psycopg = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

#: The only setting names that may be written into a statement's text.
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


@functools.lru_cache(maxsize=256)
def opening_select(timeouts: tuple[tuple[str, int], ...], columns: tuple[str, ...] = ()) -> str:
    """``SELECT set_config(...), ..., <columns>`` (``""`` when there is neither), built once per set of values."""
    selected = [set_config_literal(name, ms) for name, ms in timeouts] + list(columns)
    return f"SELECT {', '.join(selected)}" if selected else ""


def foldable(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` is a psycopg 3 connection about to send its own ``BEGIN`` (so the fold can replace it).

    Not with psycopg2, in autocommit, when a transaction is already open (autocommit turned off by hand and a
    statement run) or in pipeline mode; the caller then sends its settings as a separate, parameterised statement.
    Read through psycopg's public ``ConnectionInfo`` and ``pgconn``.
    """
    if psycopg is None:  # pragma: no cover - psycopg2-only installations
        return False
    raw = connection.connection
    return (
        isinstance(raw, psycopg.Connection)
        and not raw.autocommit
        and raw.info.transaction_status == pq.TransactionStatus.IDLE
        and raw.pgconn.pipeline_status == pq.PipelineStatus.OFF
    )


def begin_with_settings(
    connection: BaseDatabaseWrapper, timeouts: Mapping[str, int], columns: Sequence[str]
) -> tuple[str | None, ...]:
    """Begin ``connection``'s transaction with ``timeouts`` (milliseconds) applied locally, in one round trip.

    Call only when ``foldable(connection)``, right after an outermost ``atomic()`` was entered. Also selects
    ``columns`` (constant SQL expressions of lockkit's own, e.g. ``pg_current_xact_id()``) in the same statement and
    returns their values as text, in order.

    Raises:
        TypeError, ValueError: as ``set_config_literal`` (an invariant: callers pass lockkit's own values).
        django.db.DatabaseError: as for any statement (the driver's error, wrapped by Django).
    """
    raw = connection.connection
    sql = f"{begin_statement(raw)}; {opening_select(tuple(timeouts.items()), tuple(columns))}"
    connection.validate_thread_sharing()
    # Django's stubs type the argument as a CursorWrapper; at run time it is any DB-API cursor.
    cursor: Any = _SimpleQueryCursor(raw, first_column=len(timeouts))
    if connection.execute_wrappers:
        # Through Django's cursor wrapper, so execute_wrapper() hooks see this statement like any other.
        wrapped = connection.make_cursor(cursor)
        if connection.queries_logged:
            with connection.make_debug_cursor(cursor).debug_sql(sql):
                wrapped.execute(sql)
        else:
            wrapped.execute(sql)
    elif connection.queries_logged:
        # DEBUG, CaptureQueriesContext: Django's public debug_sql() records it in connection.queries.
        with connection.make_debug_cursor(cursor).debug_sql(sql), connection.wrap_database_errors:
            cursor.execute(sql)
    else:
        # What Django's cursor wrapper does for a statement when no hook is installed: its error wrapping
        # (DatabaseError, marking a broken connection unusable), without building a wrapper per statement.
        with connection.wrap_database_errors:
            cursor.execute(sql)
    row: tuple[str | None, ...] = cursor.row
    return row


def begin_statement(raw: psycopg.Connection[Any]) -> str:
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
        self.connection = raw  # as a psycopg cursor has: an execute wrapper may read it
        self._first_column = first_column  # the columns before it (set_config's results) are not read
        self.rowcount = -1
        self.row: tuple[str | None, ...] = ()

    def execute(self, sql: str, params: object = None) -> None:
        if params is not None:  # pragma: no cover - invariant: the statement is built without parameters
            raise TypeError("the opening statement takes no parameters")
        encoding = self._raw.info.encoding
        with self._raw.lock:
            result = self._raw.pgconn.exec_(sql.encode(encoding))
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
        message = (result.error_message or b"").decode(encoding, "replace").strip()
        code = result.error_field(pq.DiagnosticField.SQLSTATE)
        if self._raw.pgconn.status == pq.ConnStatus.BAD or not code:
            # As psycopg reports a lost connection: an OperationalError, so Django marks the connection unusable.
            raise psycopg.OperationalError(message or "the connection was lost")
        # psycopg's documented registry of SQLSTATE classes: the error carries its code (``.sqlstate``).
        raise psycopg.errors.lookup(code.decode("ascii"))(message)

    def close(self) -> None:
        """Nothing to release: no server-side or client-side state is kept."""
