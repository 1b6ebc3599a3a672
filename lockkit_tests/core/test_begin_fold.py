"""An outermost scope on psycopg 3 sends BEGIN and its timeouts at entry, as one message: one round trip.

Every other case (a nested scope, an open transaction, psycopg2) sends them as a statement of their own.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import OperationalError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit.backends.postgresql import PostgreSQLTransactions
from lockkit.testing import assert_single_alias, hold_lock
from lockkit_harness import sessions
from lockkit_tests.models import Stock
from lockkit_tests.support.util import identify_server, show

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _server_identified() -> None:
    """The statements pinned here are a connection's later openings (its first also reads the server's identity)."""
    identify_server("default")


# Django logs its own transaction markers in connection.queries; they are not statements sent by lockkit.
_MARKERS = {"BEGIN", "COMMIT", "ROLLBACK"}


def statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if q["sql"] not in _MARKERS]


@pytest.fixture
def notices() -> Iterator[list[str]]:
    """Server notices on this thread's default connection, e.g. "there is already a transaction in progress"."""
    connection.ensure_connection()
    raw = connection.connection
    assert isinstance(raw, psycopg.Connection)
    seen: list[str] = []

    def handler(diagnostic: psycopg.errors.Diagnostic) -> None:
        seen.append(f"{diagnostic.severity}: {diagnostic.message_primary}")

    raw.add_notice_handler(handler)
    yield seen
    raw.remove_notice_handler(handler)


def test_outermost_scope_begins_with_its_timeouts_in_one_statement(notices: list[str]) -> None:
    with CaptureQueriesContext(connection) as queries:
        with lockkit.locked(lock_timeout=2, statement_timeout=7):
            assert show("lock_timeout") == "2s"
            assert show("statement_timeout") == "7s"
    first = statements(queries)[0]
    assert first == (
        "BEGIN; SELECT set_config('lock_timeout', '2000ms', true), set_config('statement_timeout', '7000ms', true)"
        # The transaction id rides on the same statement (it resolves a COMMIT whose reply was lost).
        ", pg_current_xact_id()::text"
    )
    assert not [sql for sql in statements(queries)[1:] if "set_config" in sql]
    # psycopg sent no BEGIN of its own: the server would have warned about a transaction already in progress.
    assert notices == []
    assert show("lock_timeout") == "0"  # transaction-scoped: nothing reaches the session
    assert show("statement_timeout") == "0"


def test_folded_begin_commits_and_rolls_back_like_a_plain_one() -> None:
    with lockkit.locked() as scope:
        Stock.objects.create(sku="kept", available=1)
        assert scope.alias == "default"
    with pytest.raises(RuntimeError), lockkit.locked():
        Stock.objects.create(sku="dropped", available=1)
        raise RuntimeError("roll back")
    assert list(Stock.objects.values_list("sku", flat=True)) == ["kept"]
    assert not connection.in_atomic_block
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_folded_lock_timeout_is_enforced_and_classified() -> None:
    stock = Stock.objects.create(sku="held", available=1)
    with hold_lock(stock), pytest.raises(lockkit.LockTimeout), lockkit.locked(lock_timeout=0.05) as scope:
        scope.get(Stock, sku="held")
    with lockkit.locked() as scope:  # the connection is usable afterwards, and folds again
        assert scope.get(Stock, sku="held").available == 1


def test_folded_begin_keeps_the_connection_isolation_level() -> None:
    connection.ensure_connection()
    raw = connection.connection
    raw.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        with CaptureQueriesContext(connection) as queries, lockkit.locked():
            assert show("transaction_isolation") == "repeatable read"
        assert statements(queries)[0].startswith("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT")
    finally:
        raw.isolation_level = None


def test_nested_scope_and_open_transaction_keep_the_separate_statement() -> None:
    with transaction.atomic():
        show("lock_timeout")  # the transaction is open: psycopg has sent its BEGIN
        with CaptureQueriesContext(connection) as queries, lockkit.locked(lock_timeout=3):
            assert show("lock_timeout") == "3s"
    sqls = statements(queries)
    assert not any(sql.startswith("BEGIN") for sql in sqls)
    assert any("set_config" in sql for sql in sqls)


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_folded_statement_goes_through_execute_wrappers_on_the_scope_alias() -> None:
    identify_server("other")
    with (
        CaptureQueriesContext(connections["other"]) as queries,
        assert_single_alias("other") as log,
        lockkit.locked("other"),
    ):
        assert show("lock_timeout", using="other") == "5s"
    # A wrapper installed before the scope sees the opening (on the scope's alias) and then the body's statement.
    opening = "BEGIN; SELECT set_config('lock_timeout', '5000ms', true), pg_current_xact_id()::text"
    assert log.on("other") == [opening, "SELECT current_setting(%s)"]
    assert statements(queries)[0] == opening


def test_a_scope_that_runs_no_statement_sends_only_its_opening() -> None:
    with CaptureQueriesContext(connection) as queries, lockkit.locked(lock_timeout=2):
        pass
    assert statements(queries) == [
        "BEGIN; SELECT set_config('lock_timeout', '2000ms', true), pg_current_xact_id()::text"
    ]
    assert connection.execute_wrappers == []


def test_no_timeout_sends_no_statement() -> None:
    with CaptureQueriesContext(connection) as queries, lockkit.locked(lock_timeout=None):
        pass
    assert not any("set_config" in sql for sql in statements(queries))


def test_broken_connection_during_folded_begin_is_a_django_error() -> None:
    connection.ensure_connection()
    pid = sessions.session_of("default")
    with pytest.raises(OperationalError), lockkit.locked():
        # Ended after the scope began (its BEGIN waits for the first statement) and checked the connection.
        assert sessions.terminate("default", pid)
        show("lock_timeout")  # carries the BEGIN: the dead session fails it
    with lockkit.locked():  # the dead connection was discarded: the next scope reconnects
        assert show("lock_timeout") == "5s"


def test_nested_scope_inside_a_folded_one_restores_the_folded_values() -> None:
    with CaptureQueriesContext(connection) as queries, lockkit.locked(lock_timeout=2, statement_timeout=7):
        with lockkit.locked(lock_timeout=3):
            assert (show("lock_timeout"), show("statement_timeout")) == ("3s", "7s")
        assert (show("lock_timeout"), show("statement_timeout")) == ("2s", "7s")
        with pytest.raises(RuntimeError), lockkit.locked(lock_timeout=4, statement_timeout=5):
            assert (show("lock_timeout"), show("statement_timeout")) == ("4s", "5s")
            raise RuntimeError("the savepoint rollback restores")
        assert (show("lock_timeout"), show("statement_timeout")) == ("2s", "7s")
    assert statements(queries)[0].startswith("BEGIN; SELECT set_config('lock_timeout', '2000ms', true)")
    assert (show("lock_timeout"), show("statement_timeout")) == ("0", "0")


def test_the_literal_is_always_lockkits_int_of_milliseconds() -> None:
    from lockkit.backends.postgresql.opening import set_config_literal

    assert set_config_literal("lock_timeout", 1500) == "set_config('lock_timeout', '1500ms', true)"
    for bad in ("5000", 5000.0, True, None, b"5000"):
        with pytest.raises(TypeError, match="milliseconds must be an int"):
            set_config_literal("lock_timeout", bad)  # type: ignore[arg-type]
    for out_of_range in (0, -1, 2**31):
        with pytest.raises(ValueError, match="milliseconds must be between"):
            set_config_literal("lock_timeout", out_of_range)
    with pytest.raises(ValueError, match="name must be one of"):
        set_config_literal("search_path", 5)


def test_fractional_durations_become_whole_milliseconds_in_the_statement() -> None:
    with CaptureQueriesContext(connection) as queries, lockkit.locked(lock_timeout=0.0015):
        assert show("lock_timeout") == "2ms"
    assert statements(queries)[0] == (
        "BEGIN; SELECT set_config('lock_timeout', '2ms', true), pg_current_xact_id()::text"
    )


def test_opening_columns_ride_on_the_opening_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        PostgreSQLTransactions, "opening_columns", lambda self, connection: ("pg_current_xact_id()",)
    )
    with CaptureQueriesContext(connection) as queries, lockkit.locked() as scope:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_xact_id()::text")
            (xid,) = cursor.fetchone()
        assert scope._transaction.opened == (xid,)
        with lockkit.locked() as inner:  # a nested scope selects no opening column
            assert inner._transaction.opened == ()
    assert statements(queries)[0] == (
        "BEGIN; SELECT set_config('lock_timeout', '5000ms', true), pg_current_xact_id()"
    )
    with CaptureQueriesContext(connection) as queries, lockkit.locked(lock_timeout=None) as scope:
        (later,) = scope._transaction.opened  # no timeout to set: the opening still reads the column
        assert later is not None
        assert int(later) > int(xid)
    assert statements(queries)[0] == "BEGIN; SELECT pg_current_xact_id()"
