"""A claims call on psycopg 3 sends its transaction's opening with its first statement: one round trip less.

``BEGIN; SELECT set_config('lock_timeout', ...), pg_current_xact_id()::text; <claims statement>`` travels as one
message; the values stay parameters up to the driver's cursor; nothing is left behind (no execute wrapper, no
transaction); the transaction id still arrives before COMMIT, so a lost COMMIT reply is resolved. The scopes of
user code keep their opening at entry (``psycopg_begin.opening_deferred`` is the claims runner's alone).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit.backends.psycopg_begin import opening_deferred
from lockkit.claims import StaleClaim, claim, claim_next, complete
from lockkit.testing import hold_lock
from lockkit_tests.faultkit import proxied
from lockkit_tests.models import Item, Job
from sample_project.faults.proxy import FaultProxy

pytestmark = pytest.mark.django_db(transaction=True)

OPENING = "BEGIN; SELECT set_config('lock_timeout', '5000ms', true), pg_current_xact_id()::text"


def _statements(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries]


def _left_clean() -> None:
    assert connection.execute_wrappers == []
    assert not connection.in_atomic_block
    assert connection.get_autocommit()
    raw: Any = connection.connection
    assert raw.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_claim_next_and_complete_carry_the_opening_in_their_statement() -> None:
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    seen: list[tuple[str, Any]] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy), CaptureQueriesContext(connection) as queries:
        (made,) = claim_next(Job.objects.filter(state="pending"), worker="w-carried", lease=30, limit=1)
        complete(made, set={"state": "done"})
    sent = _statements(queries)
    # Django logs BEGIN and COMMIT itself; between them, one statement per call, carrying the opening.
    assert [s.split("; ")[0] for s in sent] == ["BEGIN", "BEGIN", "COMMIT", "BEGIN", "BEGIN", "COMMIT"]
    # limit=1: UPDATE ... WHERE pk = (SELECT ... SKIP LOCKED)
    assert sent[1].startswith(OPENING + "; UPDATE ")
    assert sent[4].startswith(OPENING + "; UPDATE ")  # one claim: the guarded UPDATE
    # The execute wrappers see the values apart from the text, as for any Django statement.
    claiming, completing = seen
    assert claiming[0].startswith("UPDATE ")  # the caller's wrappers see the statement itself
    assert "SKIP LOCKED" in claiming[0]
    assert "w-carried" not in claiming[0]
    assert "w-carried" in claiming[1]
    assert "w-carried" in repr(completing[1])
    assert "w-carried" not in completing[0]
    row = Job.objects.get(pk=made.pk)
    assert (row.state, row.claimed_by, row.claim_token, row.lease_expires_at) == (
        "done",
        "w-carried",
        1,
        None,
    )
    _left_clean()


def test_claim_carries_the_opening_in_its_locking_select() -> None:
    job = Job.objects.create(name="a")
    with CaptureQueriesContext(connection) as queries:
        made = claim(job, worker="w1", lease=30)  # locks the row through a queryset, then updates it
    assert made is not None
    sent = _statements(queries)
    assert sent[0] == "BEGIN"
    assert sent[1].startswith(OPENING + "; SELECT ")
    assert sent[1].endswith('FOR NO KEY UPDATE OF "lockkit_tests_job"')
    assert sent[2].startswith("UPDATE ")
    assert sent[3:] == ["COMMIT"]
    _left_clean()


def test_an_executemany_first_gets_the_opening_on_its_own_before_it() -> None:
    with CaptureQueriesContext(connection) as queries, opening_deferred(), lockkit.locked() as scope:
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
    with opening_deferred(), lockkit.locked() as scope:
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


@pytest.fixture
def through_proxy() -> Iterator[tuple[str, FaultProxy]]:
    with proxied("default") as pair:
        yield pair


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


def test_defer_opening_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from lockkit.backends.postgresql import PostgreSQLBackend

    monkeypatch.setattr(PostgreSQLBackend, "defer_opening", False)
    with CaptureQueriesContext(connection) as queries, opening_deferred(), lockkit.locked():
        assert connection.execute_wrappers == []  # nothing deferred: the opening went when the scope began
        Job.objects.create(name="a")
    sent = _statements(queries)
    assert sent[:2] == ["BEGIN", OPENING]
    assert sent[2].startswith("INSERT INTO")
    _left_clean()


def test_a_carried_first_statement_runs_under_the_scopes_timeouts() -> None:
    with (
        pytest.raises(lockkit.StatementTimeout) as caught,
        opening_deferred(),
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


# -- the scopes of user code keep their opening at entry (defects a review found when every scope deferred it) ------


def test_a_user_scope_sends_its_opening_when_it_begins() -> None:
    with CaptureQueriesContext(connection) as queries, lockkit.locked():
        assert connection.execute_wrappers == []
        # The raw driver bypasses Django's execute wrappers: the timeouts are already set when it runs.
        raw: Any = connection.connection
        assert raw.execute("SELECT current_setting('lock_timeout')").fetchone() == ("5s",)
    assert _statements(queries)[:2] == ["BEGIN", OPENING]
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
