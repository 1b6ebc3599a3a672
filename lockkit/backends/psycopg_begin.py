"""Opening a transaction and applying its timeouts in one round trip, on psycopg 3.

psycopg starts a transaction by sending ``BEGIN`` on its own and waiting for the reply before the first statement,
so a ``set_config`` right after it costs a second round trip (hand-written ``SET LOCAL`` pays it too). When a
lockkit scope opens the transaction, it sends ``BEGIN; SELECT set_config(...)`` as one simple-query message instead
(libpq's ``PQexec``); psycopg then sees a transaction in progress and sends no ``BEGIN`` of its own. The settings stay
transaction-scoped (``is_local = true``). See
https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-MULTI-STATEMENT.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

try:
    import psycopg
    from psycopg import pq
except ImportError:  # pragma: no cover - psycopg2-only installations keep the two-round-trip path
    psycopg = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

# Values are built by lockkit (whole milliseconds), names are its constants: nothing else may reach the SQL text,
# which travels without parameters because the simple query protocol that allows two statements has none.
_NAME = re.compile(r"[a-z_]+")
_VALUE = re.compile(r"[0-9]+ms")


def begin_with_settings(connection: BaseDatabaseWrapper, settings: dict[str, str]) -> bool:
    """Begin ``connection``'s transaction with ``settings`` applied locally, in one round trip.

    Called right after an outermost ``atomic()`` was entered. Returns ``False``, having sent nothing, when the
    connection is not a psycopg 3 connection about to send its own ``BEGIN`` (psycopg2, autocommit, a transaction
    already open, pipeline mode); the caller then applies the settings as a separate statement.

    Raises:
        django.db.DatabaseError: as for any statement (the driver's error, wrapped by Django).
    """
    if psycopg is None or not settings:
        return False
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection) or raw.autocommit:
        return False
    if (
        raw.pgconn.transaction_status != pq.TransactionStatus.IDLE
        or raw.pgconn.pipeline_status != pq.PipelineStatus.OFF
    ):
        return False
    for name, value in settings.items():
        if not (_NAME.fullmatch(name) and _VALUE.fullmatch(value)):
            raise ValueError(f"refusing to inline {name!r}={value!r}")  # pragma: no cover - invariant
    setters = ", ".join(f"set_config('{name}', '{value}', true)" for name, value in settings.items())
    sql = f"{_begin_statement(raw)}; SELECT {setters}"
    connection.validate_thread_sharing()
    # Through Django's cursor wrapper, so execute_wrapper() hooks, connection.queries and Django's error wrapping
    # (DatabaseError, marking a broken connection unusable) see this statement like any other.
    # Django's stubs type the argument as a CursorWrapper; at run time it is any DB-API cursor (the driver's).
    cursor: Any = _SimpleQueryCursor(raw)
    wrapped = (
        connection.make_debug_cursor(cursor) if connection.queries_logged else connection.make_cursor(cursor)
    )
    wrapped.execute(sql)
    return True


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

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self._raw = raw
        self.rowcount = -1
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
            return
        if self._raw.pgconn.status == pq.ConnStatus.BAD or not result.error_field(
            pq.DiagnosticField.SQLSTATE
        ):
            # As psycopg reports a lost connection: an OperationalError, so Django marks the connection unusable.
            raise psycopg.OperationalError(result.get_error_message(encoding) or "the connection was lost")
        raise psycopg.errors.error_from_result(result, encoding=encoding)

    def close(self) -> None:
        """Nothing to release: no server-side or client-side state is kept."""
