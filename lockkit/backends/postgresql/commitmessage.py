"""A row's ``UPDATE`` and the transaction's ``COMMIT`` as one simple-query message (``LockScope.save_with_commit``).

The statement's values are bound client-side by Django's default psycopg cursor (``ClientCursor``, as for every
statement it runs), which sends the text as one simple-query message (``PQsendQuery``): the only form in which the
protocol allows several statements. The server
runs them in order and stops at the first error, so a failed ``UPDATE`` never reaches the ``COMMIT``. Once the
``COMMIT`` has run the server is idle, and psycopg's own ``commit()`` then sends nothing (it returns at once when
the transaction status is ``IDLE``), so Django's ``atomic()`` ends as usual and runs its ``on_commit`` callbacks. See
https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-MULTI-STATEMENT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import psycopg
    from psycopg import pq
except ImportError:  # pragma: no cover - psycopg2-only installations: a plain save()
    psycopg = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


def possible(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` is psycopg 3 with client-side binding, in an open transaction, not in pipeline mode.

    Client-side binding (Django's default ``ClientCursor``) is required as for the claims' one message: the
    server-binding ``Cursor`` (``OPTIONS["server_side_binding"]``) may prepare a statement it has seen often, and a
    prepared statement cannot hold two. Read locally.
    """
    if psycopg is None:  # pragma: no cover - psycopg2-only installations
        return False
    raw = connection.connection
    return (
        isinstance(raw, psycopg.Connection)
        and issubclass(raw.cursor_factory, psycopg.ClientCursor)
        and not raw.autocommit
        and raw.info.transaction_status == pq.TransactionStatus.INTRANS
        and raw.pgconn.pipeline_status == pq.PipelineStatus.OFF
    )


def text(sql: str, params: Any) -> tuple[str, Any]:
    """``sql`` followed by ``; COMMIT``, with ``params`` unchanged: the client-side cursor binds them into the text.

    Django's default psycopg cursor (``ClientCursor``, required by ``possible``) binds values client-side and sends a
    statement with parameters as one simple-query message, as for the claims' messages; binding them here
    first (``compose_sql``) would build two more cursors per call, inside the row lock's hold.
    """
    return f"{sql}; COMMIT", params
