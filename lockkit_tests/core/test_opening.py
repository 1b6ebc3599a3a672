"""An outermost scope on psycopg 3 opens its transaction at entry in one message, through public APIs only.

``BEGIN; SELECT set_config('lock_timeout', ...), pg_current_xact_id()::text`` travels as one message before the
body runs; nothing is left behind (no execute wrapper, no transaction, psycopg's own flags as they were); the
transaction id is known before COMMIT, so a lost COMMIT reply is resolved. Every way into the driver that bypasses
Django's cursor (the raw driver, ``cursor.copy()``, ``transaction()``, pipelines, two-phase commit) runs in the
scope's transaction under its timeouts, because the transaction is open before the body runs.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.db.models.expressions import RawSQL
from django.test.utils import CaptureQueriesContext
from psycopg import sql as psql

import lockkit
from lockkit.claims import StaleClaim, claim_next, complete
from lockkit.testing import hold_lock
from lockkit_harness.proxy import FaultProxy
from lockkit_tests.models import Item, Job
from lockkit_tests.support.util import identify_server

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _server_identified() -> None:
    """The statements pinned here are a connection's later openings (its first also reads the server's identity)."""
    identify_server("default")


OPENING = "BEGIN; SELECT set_config('lock_timeout', '5000ms', true), pg_current_xact_id()::text"


def _statements(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries]


def _left_clean() -> None:
    assert connection.execute_wrappers == []
    assert not connection.in_atomic_block
    assert connection.get_autocommit()
    raw: Any = connection.connection
    assert raw.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_an_executemany_first_gets_the_opening_on_its_own_before_it() -> None:
    with CaptureQueriesContext(connection) as queries, lockkit.locked() as scope:
        with connection.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO lockkit_tests_item (name, value) VALUES (%s, %s)", [("a", 1), ("b", 2)]
            )
        assert scope.alias == "default"
    sent = _statements(queries)
    assert sent[:2] == ["BEGIN", OPENING]
    assert sent[2].startswith("2 times: INSERT INTO lockkit_tests_item")  # Django logs executemany so
    assert sent[-1] == "COMMIT"
    assert sorted(Item.objects.values_list("name", flat=True)) == ["a", "b"]
    _left_clean()


def test_a_first_statement_that_fails_before_it_is_sent_leaves_the_transaction_whole() -> None:
    """psycopg refuses the parameters before sending: nothing began; the scope's next statement still carries it."""
    with lockkit.locked() as scope:
        with pytest.raises(Exception), connection.cursor() as cursor:  # noqa: B017, PT011 - any driver error
            cursor.execute("SELECT %s", [object()])  # type: ignore[list-item]  # psycopg cannot adapt an object(): raised before sending
        raw: Any = connection.connection
        assert raw.autocommit is False  # psycopg still begins the transaction itself if it must
        Job.objects.create(name="kept")
        assert scope.alias == "default"
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout')")
            assert cursor.fetchone() == ("5s",)
    assert list(Job.objects.values_list("name", flat=True)) == ["kept"]
    _left_clean()


def test_a_call_that_sends_no_statement_sends_no_opening() -> None:
    with CaptureQueriesContext(connection) as queries:
        assert claim_next(Job.objects.none(), worker="w1", lease=30) == []
    assert [s for s in _statements(queries) if s not in ("BEGIN", "COMMIT")] == []
    _left_clean()


def test_errors_leave_nothing_behind_and_the_lock_timeout_bounds_the_carried_statement() -> None:
    job = Job.objects.create(name="a")
    (made,) = claim_next(Job.objects.all(), worker="w1", lease=30)
    with hold_lock(Job.objects.filter(pk=job.pk)):
        with pytest.raises(lockkit.LockTimeout) as caught:
            complete(made, lock_timeout=0.2)  # the carried UPDATE waits behind the held row
    assert caught.value.sqlstate == "55P03"
    _left_clean()
    complete(made, set={"state": "done"})
    with pytest.raises(StaleClaim):
        complete(made)
    _left_clean()
    assert Job.objects.get(pk=job.pk).state == "done"


def test_server_side_binding_keeps_the_opening_separate() -> None:
    Job.objects.create(name="a")
    connection.ensure_connection()
    raw: Any = connection.connection
    raw.cursor_factory = psycopg.Cursor  # what Django's server_side_binding option configures
    try:
        with CaptureQueriesContext(connection) as queries:
            (made,) = claim_next(Job.objects.all(), worker="w1", lease=30)
    finally:
        connection.close()
    sent = _statements(queries)
    assert sent[:2] == ["BEGIN", OPENING]
    assert sent[2].startswith("UPDATE ")
    assert Job.objects.get(pk=made.pk).claimed_by == "w1"


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_a_lost_commit_reply_of_a_carried_claim_is_resolved_as_committed(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Job.objects.create(name="a")
    connections[alias].ensure_connection()
    proxy.arm("deliver")  # the server commits; its reply to COMMIT is cut
    (made,) = claim_next(Job.objects.using(alias).all(), worker="w1", lease=30)
    assert proxy.cuts["deliver"] == 1
    row = Job.objects.get(pk=made.pk)
    assert (row.claimed_by, row.claim_token, row.attempts) == ("w1", 1, 1)  # claimed once, and told so


def test_a_carried_first_statement_runs_under_the_scopes_timeouts() -> None:
    with (
        pytest.raises(lockkit.StatementTimeout) as caught,
        lockkit.locked(statement_timeout=0.2),
    ):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(5)")  # the scope's first statement: it carries the opening
    assert caught.value.sqlstate == "57014"
    _left_clean()
    with lockkit.locked(), connection.cursor() as cursor:  # the next scope carries its own opening again
        cursor.execute("SELECT current_setting('statement_timeout'), current_setting('lock_timeout')")
        assert cursor.fetchone() == ("0", "5s")
    _left_clean()


# -- the scopes of user code: the defects a review found in the first form of this, each with its test -------------


def test_a_user_scope_carries_its_opening_in_its_first_statement_and_leaves_psycopg_as_it_found_it() -> None:
    with CaptureQueriesContext(connection) as queries, lockkit.locked() as scope:
        assert scope.alias == "default"
        raw: Any = connection.connection
        assert raw.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # opened at entry
        Item.objects.create(name="a", value=1)
        assert raw.autocommit is False
        xid = scope._transaction.xid
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_xact_id()::text::bigint, current_setting('lock_timeout')")
            assert cursor.fetchone() == (xid, "5s")
    sent = [s for s in _statements(queries) if s != "BEGIN"]
    assert sent[0] == OPENING
    assert sent[1].startswith("INSERT INTO")
    assert sent[-1] == "COMMIT"
    assert list(Item.objects.values_list("name", flat=True)) == ["a"]
    _left_clean()


def test_a_raw_driver_statement_first_runs_in_the_scopes_transaction_under_its_timeouts() -> None:
    """The raw driver bypasses Django's execute wrappers: psycopg's own BEGIN carries the timeouts then."""
    with pytest.raises(RuntimeError), lockkit.locked() as scope:
        raw: Any = connection.connection
        assert raw.execute("SELECT current_setting('lock_timeout')").fetchone() == ("5s",)
        raw.execute("INSERT INTO lockkit_tests_item (name, value) VALUES (%s, %s)", ["raw", 1])
        Item.objects.create(name="orm", value=2)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_xact_id()::text::bigint")
            assert cursor.fetchone() == (scope._transaction.xid,)
        raise RuntimeError("roll back")
    assert Item.objects.count() == 0  # both rolled back: the raw INSERT was in the scope's transaction
    _left_clean()
    with lockkit.locked():  # only raw statements: still one transaction, committed at the end
        raw = connection.connection
        raw.execute("INSERT INTO lockkit_tests_item (name, value) VALUES (%s, %s)", ["raw", 1])
    assert list(Item.objects.values_list("name", flat=True)) == ["raw"]
    _left_clean()


def test_a_copy_first_runs_under_the_scopes_lock_timeout() -> None:
    """``cursor.copy()`` bypasses the execute wrappers too; a COPY behind a held lock waits only lock_timeout."""
    Item.objects.create(name="held", value=1)
    with connection.cursor() as cursor:
        with lockkit.locked(), cursor.copy("COPY (SELECT current_setting('lock_timeout')) TO STDOUT") as copy:
            assert b"".join(bytes(chunk) for chunk in copy) == b"5s\n"
    _left_clean()
    # Another session holds the table; it gives the lock up by itself after 5 s, should the bound be missing.
    blocker = psycopg.connect(**connection.get_connection_params(), autocommit=False)
    try:
        blocker.execute("SET idle_in_transaction_session_timeout = '5s'")
        blocker.execute("LOCK TABLE lockkit_tests_item IN ACCESS EXCLUSIVE MODE")
        # The driver's own error: cursor.copy() bypasses Django's error wrapping as well.
        with pytest.raises(psycopg.errors.LockNotAvailable) as caught, lockkit.locked(lock_timeout=0.2):
            with (
                connection.cursor() as cursor,
                cursor.copy("COPY lockkit_tests_item (name, value) FROM STDIN") as c,
            ):
                c.write_row(("copied", 2))
    finally:
        blocker.close()
    assert caught.value.sqlstate == "55P03"
    _left_clean()
    assert list(Item.objects.values_list("name", flat=True)) == ["held"]


def test_a_nested_scope_first_carries_the_outer_opening_in_its_savepoint() -> None:
    with lockkit.locked(), lockkit.locked(lock_timeout=1) as inner:
        assert inner.alias == "default"
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout')")
            assert cursor.fetchone() == ("1s",)
    _left_clean()
    with lockkit.locked():
        with lockkit.locked(lock_timeout=1):
            pass
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout')")
            assert cursor.fetchone() == ("5s",)  # the outer value, put back
    _left_clean()


def test_the_connections_isolation_level_rides_on_the_carried_begin() -> None:
    connection.ensure_connection()
    raw: Any = connection.connection
    raw.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        with lockkit.locked(), connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('transaction_isolation')")
            assert cursor.fetchone() == ("repeatable read",)
        with lockkit.locked():  # through psycopg's own BEGIN, the raw driver's path
            row = raw.execute("SELECT current_setting('transaction_isolation')").fetchone()
            assert row == ("repeatable read",)
    finally:
        raw.isolation_level = None
    _left_clean()


def test_the_connections_isolation_level_rides_on_the_one_message_calls() -> None:
    """``guarded_update`` and claims sent as one message begin as psycopg would: at the connection's isolation level.

    Before, their ``BEGIN`` was a bare one: read committed in a project configured for serializable.
    """
    Item.objects.create(name="before", value=1)
    Job.objects.create(name="j")
    connection.ensure_connection()
    raw: Any = connection.connection
    raw.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    level = RawSQL("current_setting('transaction_isolation')", [])
    try:
        (written,) = lockkit.guarded_update(Item.objects.filter(value=1), name=level)
        (claim,) = claim_next(
            Job.objects.filter(state="pending"), worker="w", lease=30, set={"result": level}
        )
    finally:
        raw.isolation_level = None
    assert written.name == Item.objects.get(value=1).name == "serializable"
    assert Job.objects.get(pk=claim.pk).result == "serializable"
    _left_clean()


def test_select_for_update_iterator_works_after_another_statement_in_a_user_scope() -> None:
    Item.objects.bulk_create([Item(name=f"i{i}", value=i) for i in range(3)])
    with lockkit.locked():
        assert Item.objects.count() == 3
        # Django declares its server-side cursor WITH HOLD when psycopg says autocommit: FOR UPDATE refuses that.
        rows = list(Item.objects.select_for_update().order_by("pk").iterator(chunk_size=2))
    assert [r.name for r in rows] == ["i0", "i1", "i2"]
    _left_clean()


def test_a_statement_an_execute_wrapper_runs_during_a_claim_joins_the_claims_transaction() -> None:
    """With an execute wrapper installed a claims call runs in a scope of its own, not as one message."""
    Job.objects.create(name="a")

    def audit(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "SKIP LOCKED" in sql:
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO lockkit_tests_item (name, value) VALUES (%s, %s)", ["audit", 1])
            raise RuntimeError("the audit refuses the claim")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(audit), pytest.raises(RuntimeError):
        claim_next(Job.objects.all(), worker="w1", lease=30)
    assert Item.objects.filter(name="audit").count() == 0  # rolled back with the claim, never autocommitted
    assert Job.objects.get().claim_token == 0  # not claimed
    _left_clean()


# -- what a second hostile review found in the first form of this, each with its test --------------------------------


def _names() -> list[str]:
    return sorted(Item.objects.values_list("name", flat=True))


def test_the_drivers_own_transaction_first_is_a_savepoint_in_the_scopes_transaction() -> None:
    with pytest.raises(RuntimeError), lockkit.locked():
        raw: Any = connection.connection
        with raw.transaction():
            assert raw.execute("SELECT current_setting('lock_timeout')").fetchone() == ("5s",)
            raw.execute("INSERT INTO lockkit_tests_item (name, value) VALUES (%s, %s)", ["rawtx", 1])
        Item.objects.create(name="orm", value=2)
        raise RuntimeError("roll back")
    assert _names() == []  # psycopg's block did not commit on its own: it was a savepoint
    _left_clean()


def test_the_drivers_pipeline_first_sends_the_opening_before_it_starts() -> None:
    with lockkit.locked() as scope:
        raw: Any = connection.connection
        with raw.pipeline():
            Item.objects.create(name="p", value=1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout'), pg_current_xact_id()::text::bigint")
            assert cursor.fetchone() == ("5s", scope._transaction.xid)
    assert _names() == ["p"]
    _left_clean()


def test_a_raw_executemany_first_has_its_transaction_id_read_before_commit() -> None:
    """psycopg runs a raw executemany in pipeline mode; the transaction id was read at entry, before it."""
    with CaptureQueriesContext(connection) as queries, lockkit.locked() as scope:
        raw: Any = connection.connection
        with raw.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO lockkit_tests_item (name, value) VALUES (%s, %s)", [("a", 1), ("b", 2)]
            )
        row = raw.execute(
            "SELECT current_setting('lock_timeout'), pg_current_xact_id()::text::bigint"
        ).fetchone()
        assert row[0] == "5s"
    assert scope._transaction.xid == row[1]
    sent = [s for s in _statements(queries) if s != "BEGIN"]  # Django logs the BEGIN of atomic() itself
    assert (sent[0], sent[-1]) == (OPENING, "COMMIT")
    assert _names() == ["a", "b"]
    _left_clean()


def test_a_wrapper_installed_inside_the_scope_sees_its_statements_as_written_and_runs_its_own_inside() -> (
    None
):
    seen: list[tuple[str, bool]] = []

    def audit(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((sql, connection.connection.autocommit))
        if sql.startswith("INSERT") and not any(s.startswith("UPDATE") for s, _ in seen):
            with connection.cursor() as cursor:
                cursor.execute("UPDATE lockkit_tests_item SET value = value + 1")  # its own statement, first
            context["cursor"].cursor.connection.execute(
                "INSERT INTO lockkit_tests_item (name, value) VALUES (%s, %s)", ["audit", 0]
            )
        return execute(sql, params, many, context)

    with pytest.raises(RuntimeError), lockkit.locked():
        with connection.execute_wrapper(audit):
            Item.objects.create(name="orm", value=1)
        raise RuntimeError("roll back")
    assert _names() == []  # the audit rows were in the scope's transaction
    # The opening went at entry, before the wrapper was installed; the wrapper's statements appear as written.
    assert [sql.split()[0] for sql, _ in seen] == ["INSERT", "UPDATE"]
    assert not any(autocommit for _, autocommit in seen)
    _left_clean()


def test_wrappers_installed_inside_the_scope_leave_with_their_block_after_a_first_statement_fails() -> None:
    def passing(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        return execute(sql, params, many, context)

    def swallowing(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        return None  # a dry-run wrapper: nothing is sent

    with lockkit.locked():
        with pytest.raises(Exception), connection.cursor() as cursor:  # noqa: B017, PT011 - any driver error
            cursor.execute("SELECT %s", [object()])  # type: ignore[list-item]  # refused before sending: the opening waits again
        with connection.execute_wrapper(passing), connection.cursor() as cursor:
            cursor.execute("SELECT 1")  # a wrapper inside ours: the opening goes on its own first
        assert passing not in connection.execute_wrappers  # Django's pop() removed its own wrapper
        with connection.execute_wrapper(swallowing), connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        assert swallowing not in connection.execute_wrappers
        Item.objects.create(name="kept", value=1)
    assert _names() == ["kept"]
    _left_clean()


@pytest.mark.parametrize(
    ("statement", "expected"),
    [(psql.SQL("SELECT {}").format(psql.Literal(7)), 7), (b"SELECT 8", 8)],
    ids=["composed", "bytes"],
)
def test_a_first_statement_that_is_not_a_str_gets_the_opening_on_its_own(
    statement: Any, expected: int
) -> None:
    with lockkit.locked() as scope, connection.cursor() as cursor:
        cursor.execute(statement)
        assert cursor.fetchone() == (expected,)
        assert isinstance(scope._transaction.xid, int)
    _left_clean()


def test_the_driver_switched_to_autocommit_inside_a_scope_is_refused() -> None:
    with pytest.raises(psycopg.ProgrammingError, match="autocommit"), lockkit.locked():
        raw: Any = connection.connection
        raw.autocommit = True  # idle, so psycopg allows it
        raw.execute("INSERT INTO lockkit_tests_item (name, value) VALUES (%s, %s)", ["escaped", 1])
    raw.autocommit = False
    connection.close()  # Django's view of the connection is out of date: start again
    assert _names() == []
    with lockkit.locked():  # the next scope works
        Item.objects.create(name="next", value=1)
    assert _names() == ["next"]


# -- a third review ------------------------------------------------------------------------------------------------


def test_a_rollback_asked_for_after_a_raw_executemany_is_quiet() -> None:
    """The transaction id is read before COMMIT only: a scope that rolls back sends nothing more."""
    with lockkit.locked():
        raw: Any = connection.connection
        with raw.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO lockkit_tests_item (name, value) VALUES (%s, %s)", [("a", 1), ("b", 2)]
            )
        transaction.set_rollback(True)
    assert _names() == []
    _left_clean()


def test_an_empty_first_statement_shows_an_empty_result_not_the_openings_row() -> None:
    with lockkit.locked() as scope, connection.cursor() as cursor:
        cursor.execute("-- nothing to do")
        assert cursor.description is None
        assert isinstance(scope._transaction.xid, int)
        cursor.execute("SELECT current_setting('lock_timeout')")
        assert cursor.fetchone() == ("5s",)
    _left_clean()


def test_the_drivers_tpc_begin_first_is_refused_as_inside_a_transaction() -> None:
    with pytest.raises(psycopg.ProgrammingError, match="INTRANS"), lockkit.locked(lock_timeout=0.5):
        raw: Any = connection.connection
        raw.tpc_begin(raw.xid(1, "g", "b"))
    _left_clean()


def test_the_drivers_tpc_recover_first_keeps_the_scopes_transaction_and_timeouts() -> None:
    """psycopg rolls back a transaction its own recover query began: the scope's must already be open."""
    with lockkit.locked(lock_timeout=0.5) as scope:
        raw: Any = connection.connection
        assert raw.tpc_recover() == []
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout'), pg_current_xact_id()::text::bigint")
            assert cursor.fetchone() == ("500ms", scope._transaction.xid)
    _left_clean()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_scopes_on_two_aliases_in_one_operation_each_carry_their_own_opening() -> None:
    with (
        CaptureQueriesContext(connections["other"]) as other_sent,
        lockkit.locked("default", lock_timeout=2) as first,
        lockkit.locked("other", lock_timeout=3) as second,
    ):
        with connections["other"].cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout'), pg_current_xact_id()::text::bigint")
            assert cursor.fetchone() == ("3s", second._transaction.xid)
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout'), pg_current_xact_id()::text::bigint")
            assert cursor.fetchone() == ("2s", first._transaction.xid)
    assert next(q["sql"] for q in other_sent.captured_queries if q["sql"] != "BEGIN").startswith(
        "BEGIN; SELECT set_config('lock_timeout', '3000ms', true)"
    )
    for alias in ("default", "other"):
        assert connections[alias].execute_wrappers == []
        with connections[alias].cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone() == ("0",)


def test_a_connections_first_opening_also_reads_the_servers_identity_and_later_ones_do_not() -> None:
    connection.close()
    connection.ensure_connection()  # a fresh driver connection: nothing known about its server yet
    with CaptureQueriesContext(connection) as first, lockkit.locked():
        pass
    with CaptureQueriesContext(connection) as second, lockkit.locked():
        pass
    identity = (
        ", (SELECT system_identifier::text FROM pg_control_system()), CASE WHEN pg_is_in_recovery() THEN NULL "
        "ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END"
    )
    # (Django logs its own "BEGIN" and "COMMIT" entries; the opening is still one statement: no extra round trip.)
    assert _statements(first) == ["BEGIN", OPENING + identity, "COMMIT"]
    assert _statements(second) == ["BEGIN", OPENING, "COMMIT"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT system_identifier::text, substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) "
            "FROM pg_control_system()"
        )
        server = cursor.fetchone()
    from lockkit.backends import backend_for

    assert backend_for(connection).tx.transaction_server(connection) == server
