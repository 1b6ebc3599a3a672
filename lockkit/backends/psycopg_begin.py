"""Opening a transaction, applying its timeouts and running its first statement in one round trip, on psycopg 3.

psycopg starts a transaction by sending ``BEGIN`` on its own and waiting for the reply before the first statement,
so a ``set_config`` right after it costs a second round trip (hand-written ``SET LOCAL`` pays it too). When a
lockkit scope opens the transaction, it sends ``BEGIN; SELECT set_config(...)`` as one simple-query message instead
(libpq's ``PQexec``); psycopg then sees a transaction in progress and sends no ``BEGIN`` of its own. The settings
stay transaction-scoped (``is_local = true``). See
https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-MULTI-STATEMENT.

An outermost scope on a client-side cursor (Django's default) goes one step further (``PendingOpening``): it sends
nothing when it begins, and its first statement carries the opening in the same message, ``BEGIN; SELECT
set_config(...), pg_current_xact_id()::text; <statement>``. The statement's values stay parameters up to the
driver: psycopg's client-side cursor binds them as it does for any statement. psycopg sends no ``BEGIN`` of its own
for that message: its ``autocommit`` flag is set while the connection is idle, right before the message is sent,
and cleared as soon as the reply is in, so Django and psycopg see an ordinary transaction for the rest of the scope
(Django declares server-side cursors ``WITH HOLD`` when the flag says autocommit). The transaction id arrives with
the statement's reply, before COMMIT is sent, so a lost COMMIT is still resolved. A statement that bypasses
Django's execute wrappers (``cursor.copy()``, the raw driver connection) goes through psycopg's ``_start_query``
step, which lockkit replaces on that connection object while the opening is pending: psycopg's own ``BEGIN``, then
the opening, before the statement runs.

The opening has no parameters (a message of several statements cannot bind them on the server), so this is the
one place where lockkit writes values into SQL text, under a narrow rule: a value is an ``int`` number of
milliseconds that lockkit computed itself from a validated duration, formatted with ``%d``; a name is one of
lockkit's own setting names; an extra column is one of the backend's own constant expressions. Nothing that came
from a user as text ever reaches it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
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


@functools.lru_cache(maxsize=256)
def _settings_text(timeouts: tuple[tuple[str, int], ...], columns: tuple[str, ...], encoding: str) -> bytes:
    """``SELECT set_config(...), <columns>`` (as the connection's encoding), built once per set of values."""
    selected = [set_config_literal(name, ms) for name, ms in timeouts] + list(columns)
    return f"SELECT {', '.join(selected)}".encode(encoding)


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
        self.connection = raw  # as a psycopg cursor has: an execute wrapper may read it
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


# -- the opening deferred to the scope's first statement -----------------------------------------------------------


def deferrable(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection``'s opening can ride on the scope's first statement (call after ``foldable``).

    Only where psycopg binds parameters on the client (Django's default cursor), so the statement's text can follow
    the opening in the same simple-query message, and on a psycopg with the two internals ``PendingOpening`` relies
    on (the ``_autocommit`` attribute, the ``_start_query`` step every statement goes through); otherwise the
    opening is sent at scope entry.
    """
    raw = connection.connection
    factory = getattr(raw, "cursor_factory", None)
    return (
        isinstance(factory, type)
        and issubclass(factory, psycopg.ClientCursor)
        and isinstance(getattr(raw, "_autocommit", None), bool)
        and hasattr(raw, "__dict__")
        and callable(getattr(type(raw), "_start_query", None))
    )


def _texts(row: Sequence[Any] | None, *, skip: int) -> tuple[str | None, ...]:
    """The values of ``row`` after the first ``skip``, as text (``None`` kept)."""
    return tuple(None if value is None else str(value) for value in (row or ())[skip:])


class PendingOpening:
    """An outermost scope's opening, not sent yet: the scope's first statement carries it.

    Every way a statement can reach the server sends the opening first, or with it:

    - Through Django's cursor (the ORM, ``connection.cursor()``): ``carry``, an execute wrapper, sends
      ``BEGIN; SELECT set_config(...), <opening columns>; <statement>`` as one message when it is the innermost
      wrapper, the statement a ``str`` and the cursor psycopg's client-side one; otherwise it sends the opening
      on its own first (``begin_with_settings``), so that a wrapper installed inside the scope sees the statement
      as written, and runs its own statements in the transaction.
    - Around Django's execute wrappers: every statement of a psycopg connection goes through its
      ``_start_query`` step (``cursor.copy()``, the raw driver's ``execute()``, server-side cursors). While the
      opening is pending, that step is ``_net`` (an instance attribute of that connection object): psycopg's own
      ``BEGIN``, then ``SELECT set_config(...), <opening columns>``, before the statement (two round trips, on this
      path only). The driver's ``transaction()``, ``pipeline()``, ``tpc_begin()`` and ``tpc_recover()`` send the
      opening before they start (as the scope would have at its entry), so a ``transaction()`` block is a
      savepoint in the scope's transaction, ``tpc_begin()`` is refused as inside any transaction, and
      ``tpc_recover()`` does not roll back the scope's transaction as one its own query began.

    The execute wrapper stays in place until the scope ends (removed by identity), so the wrappers installed
    inside the scope are removed by Django in the order it expects.

    Attributes:
        opened: The values of the opening columns (as text), once the opening ran; empty before.
    """

    #: The driver connection's methods that send the opening first while it is pending (``_opened_first``).
    _OPENED_FIRST = ("transaction", "pipeline", "tpc_begin", "tpc_recover")

    def __init__(self, connection: BaseDatabaseWrapper, timeouts: Mapping[str, int], columns: Sequence[str]):
        """Defer the opening of ``connection``'s transaction until its first statement."""
        self.connection = connection
        self.timeouts = dict(timeouts)
        self.columns = tuple(columns)
        self.opened: tuple[str | None, ...] = ()
        self._raw: Any = connection.connection
        self._encoding = self._raw.info.encoding
        self._items = tuple(self.timeouts.items())
        self._settings = _settings_text(self._items, self.columns, self._encoding)
        self._pending = False
        self._guard: Callable[..., Any] = self.carry  # one bound method, removed by identity
        connection.execute_wrappers.append(self._guard)
        self._arm()

    def _arm(self) -> None:
        self._pending = True
        stand_ins = vars(self._raw)  # instance attributes: this connection object only
        stand_ins["_start_query"] = self._net
        for name in self._OPENED_FIRST:
            stand_ins[name] = functools.partial(self._opened_first, name)

    def _take(self) -> bool:
        """Stop waiting; return whether the opening was still pending (the caller now sends it)."""
        if not self._pending:
            return False
        self._pending = False
        stand_ins = vars(self._raw)
        for name in ("_start_query", *self._OPENED_FIRST):
            stand_ins.pop(name, None)  # psycopg's own methods again
        return True

    def cancel(self) -> None:
        """The scope ends: remove the execute wrapper; if no statement ran, nothing was sent, nothing to send."""
        self._take()
        wrappers = self.connection.execute_wrappers
        for index in range(len(wrappers) - 1, -1, -1):
            if wrappers[index] is self._guard:
                del wrappers[index]
                break

    def settle(self) -> None:
        """Before COMMIT: read the opening columns if the opening went without them (the driver's pipeline mode).

        One statement, only then, and only in a transaction in progress (an aborted one cannot commit anyway), so
        that a COMMIT whose reply is lost can still be resolved.

        Raises:
            django.db.DatabaseError: as for any statement; the scope then rolls back and raises it.
        """
        raw = self._raw
        if (
            self.opened
            or not self.columns
            or self._pending
            or raw is not self.connection.connection
            or raw.closed
            or raw.pgconn.transaction_status != pq.TransactionStatus.INTRANS
        ):
            return
        self._read(f"SELECT {', '.join(self.columns)}", skip=0)

    def carry(self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any) -> Any:
        """A Django execute wrapper: send the opening with the first statement, in one message.

        ``BEGIN; SELECT set_config(...), <opening columns>; <statement>`` goes as one simple query (psycopg's
        client-side cursor binds the statement's parameters, as it does for any statement). psycopg sends no
        ``BEGIN`` of its own for it: its ``autocommit`` flag is set while the connection is idle, right before the
        message goes out, and cleared again as soon as the reply is in (psycopg refuses to change the flag inside
        a transaction, so the attribute is written directly), so Django and psycopg see an ordinary transaction
        for the rest of the scope. Otherwise (another wrapper inside this one, an ``executemany``, a server-side
        cursor, a statement that is not a ``str``) the opening goes on its own first.
        """
        if not self._pending:
            return execute(sql, params, many, context)
        raw = self._raw
        if raw is not self.connection.connection or raw.closed:
            self._take()  # the connection was replaced: nothing of ours is open there
            return execute(sql, params, many, context)
        wrappers = self.connection.execute_wrappers
        cursor: Any = getattr(context.get("cursor"), "cursor", None)
        carried = (
            not many
            and type(sql) is str
            and isinstance(cursor, psycopg.ClientCursor)
            and wrappers[-1] is self._guard
            and foldable(self.connection)
        )
        if not carried:
            self._open_now()
            return execute(sql, params, many, context)
        self._take()
        # Read now, not at scope entry: the isolation level and access mode can still change until something is sent.
        opening = _folded_sql(_begin_statement(raw), self._items, self.columns)
        # The attribute behind psycopg's autocommit setter, written directly: the connection is idle (foldable()
        # checked it), where the setter would only check that and write it, and inside the transaction, after the
        # reply, where the setter refuses to.
        raw._autocommit = True
        try:
            result = execute(f"{opening}; {sql}", params, many, context)
        finally:
            raw._autocommit = False
            began = raw.closed or raw.pgconn.transaction_status != pq.TransactionStatus.IDLE
            if not began:
                # Nothing began: the statement failed before it was sent (psycopg could not adapt a value) or
                # the server refused the message as a whole (a syntax error). The next statement carries it.
                self._arm()
        if not began:  # pragma: no cover - Django's own execute always sends or raises
            return result
        cursor.nextset()  # from BEGIN's result to the opening's row
        self.opened = _texts(cursor.fetchone(), skip=len(self._items))
        if not cursor.nextset():  # to the statement's own result, where Django reads it
            # The statement had none (empty, or only a comment): run it again on its own, so the cursor shows
            # its empty result rather than the opening's row.
            return execute(sql, params, many, context)
        return result

    def _open_now(self) -> None:
        """Send the opening on its own (folded with ``BEGIN``, one round trip), if it is still pending."""
        if not self._take():
            return
        self._refuse_autocommit()
        if foldable(self.connection):
            self.opened = begin_with_settings(self.connection, self.timeouts, self.columns)
        elif not self._raw.closed and self._raw.pgconn.transaction_status == pq.TransactionStatus.INTRANS:
            # Begun by a way lockkit does not stand in for: the settings still apply, in a statement of their own.
            self._read(self._settings.decode(self._encoding), skip=len(self._items))

    def _read(self, sql: str, *, skip: int) -> None:
        """Run ``sql`` (lockkit's own, no parameters) through Django's cursor; keep its row's columns after ``skip``."""
        with self.connection.cursor() as cursor:
            cursor.execute(sql)
            self.opened = _texts(cursor.fetchone(), skip=skip)

    def _refuse_autocommit(self) -> None:
        """The driver connection was put in autocommit inside the scope: its statements would escape the scope."""
        if self._raw._autocommit:
            raise psycopg.ProgrammingError(
                "the driver connection was switched to autocommit inside a lockkit scope: its statements would "
                "run outside the scope's transaction and timeouts"
            )

    def _net(self) -> Any:
        """Stand in for psycopg's ``_start_query`` while the opening is pending: its ``BEGIN``, then the settings.

        A generator, as psycopg's is, run by psycopg under the connection's lock before each statement.
        """
        raw = self._raw
        self._refuse_autocommit()
        begins = raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
        yield from type(raw)._start_query(raw)
        if begins and self._take():
            result = yield from raw._exec_command(self._settings)
            if result is not None:  # None only in pipeline mode, which sends the opening before it starts
                values = (result.get_value(0, column) for column in range(len(self._items), result.nfields))
                self.opened = tuple(None if v is None else v.decode(self._encoding) for v in values)

    def _opened_first(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Stand in for the driver's method ``name``: send the scope's opening first, then call it.

        ``transaction()``: its block is then a savepoint of the scope's transaction (psycopg would otherwise begin
        and commit one of its own). ``pipeline()`` (which ``executemany()`` enters): ``PQexec`` is refused once in
        pipeline mode. ``tpc_begin()``: psycopg refuses it inside a transaction, as before. ``tpc_recover()``:
        psycopg rolls back a transaction its own query began, which would be the scope's.
        """
        self._open_now()
        return getattr(type(self._raw), name)(self._raw, *args, **kwargs)
