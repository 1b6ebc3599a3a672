"""PostgreSQL claims calls outside a transaction are one message each: opening, statement and COMMIT together.

``BEGIN; SELECT set_config('lock_timeout', ...); <statement>; COMMIT`` goes as one simple query through Django's
cursor: one round trip per call, no transaction id taken (an empty poll assigns none), the connection idle and in
autocommit afterwards, on success and on error. Inside the caller's ``atomic()`` a call is a plain statement of the
caller's transaction (in a savepoint).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models.expressions import RawSQL
from django.test.utils import CaptureQueriesContext

from lockkit.claims import claim_next, complete, heartbeat, reclaim_expired, release
from lockkit.errors import LockTimeout
from lockkit.testing import hold_lock
from lockkit_tests.claims_helpers import expire
from lockkit_tests.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

OPENING = "BEGIN; SELECT set_config('lock_timeout', '5000ms', true); "


def _sent(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries]


def _idle_in_autocommit() -> None:
    raw: Any = connection.connection
    assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert raw.autocommit
    assert not connection.in_atomic_block
    assert connection.execute_wrappers == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        assert cursor.fetchone() == ("0",)  # the call's lock_timeout ended with its transaction


def test_claim_next_and_complete_are_one_message_each() -> None:
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    with CaptureQueriesContext(connection) as queries:
        (made,) = claim_next(Job.objects.filter(state="pending"), worker="w", lease=30)
        complete(made, set={"state": "done"})
    claiming, completing = _sent(queries)  # nothing else: no BEGIN, no COMMIT of their own
    for message in (claiming, completing):
        assert message.startswith(OPENING + "UPDATE "), message
        assert message.endswith("; COMMIT"), message
        assert "pg_current_xact_id" not in message
    row = Job.objects.get(pk=made.pk)
    assert (row.state, row.lease_expires_at, row.claim_token) == ("done", None, 1)
    _idle_in_autocommit()


@pytest.mark.parametrize("call", ["heartbeat", "release", "reclaim_expired"])
def test_the_other_calls_are_one_message_each(call: str) -> None:
    Job.objects.create(name="a")
    (made,) = claim_next(Job.objects.all(), worker="w", lease=30)
    if call == "reclaim_expired":
        expire(made.pk)
    with CaptureQueriesContext(connection) as queries:
        if call == "heartbeat":
            renewed = heartbeat(made, lease=60)
            assert renewed.lease_expires_at > made.lease_expires_at
        elif call == "release":
            release(made, set={"state": "pending"})
        else:
            assert reclaim_expired(Job.objects.all(), set={"state": "pending"}) == 1
    (message,) = _sent(queries)
    assert message.startswith(OPENING) and message.endswith("; COMMIT"), message
    _idle_in_autocommit()


def _next_xid() -> int:
    """The first transaction id not yet assigned (reading a snapshot assigns none)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
        (xmax,) = cursor.fetchone()
    return int(xmax)


def test_polling_an_empty_queue_assigns_no_transaction_id() -> None:
    Job.objects.create(name="taken", state="running")
    empty = Job.objects.filter(state="pending")
    # Other sessions of the server (another suite, autovacuum) may take ids meanwhile: a window in which no one
    # else did shows the polls took none; a poll that took one would show in every window (20 polls, 20 ids).
    for _ in range(5):
        before = _next_xid()
        for _ in range(20):
            assert claim_next(empty, worker="w", lease=30) == []
        if _next_xid() == before:
            break
    else:
        pytest.fail("every window of 20 empty polls saw transaction ids assigned")
    _idle_in_autocommit()


def test_a_lock_timeout_inside_the_message_rolls_it_back_and_leaves_the_connection_idle() -> None:
    Job.objects.create(name="a")
    (made,) = claim_next(Job.objects.all(), worker="w", lease=30)
    with hold_lock(Job.objects.filter(pk=made.pk), timeout=20):
        with pytest.raises(LockTimeout) as raised:
            complete(made, set={"state": "done"}, lock_timeout=0.2)
    assert raised.value.sqlstate == "55P03"
    _idle_in_autocommit()
    row = Job.objects.get(pk=made.pk)
    assert (row.state, row.lease_expires_at is not None) == ("pending", True)  # nothing was written
    complete(made, set={"state": "done"})  # the next call on the same connection works
    assert Job.objects.get(pk=made.pk).state == "done"


def test_an_error_inside_the_message_rolls_it_back_and_the_next_call_works() -> None:
    Job.objects.create(name="a")
    (made,) = claim_next(Job.objects.all(), worker="w", lease=30)
    with pytest.raises(Exception) as raised:  # noqa: PT011 - the database's own error, as for any statement
        complete(made, set={"name": RawSQL("(1/0)::text", [])})  # 22012 on the server, inside the message
    assert getattr(raised.value.__cause__, "sqlstate", None) == "22012"
    _idle_in_autocommit()
    complete(made, set={"state": "done"})
    assert Job.objects.get(pk=made.pk).state == "done"


def test_inside_the_callers_atomic_a_call_is_part_of_the_callers_transaction() -> None:
    Job.objects.create(name="a")
    with pytest.raises(RuntimeError), transaction.atomic():
        (made,) = claim_next(Job.objects.all(), worker="w", lease=30)
        with CaptureQueriesContext(connection) as queries:
            complete(made, set={"state": "done"})
        assert not any(sql.endswith("; COMMIT") for sql in _sent(queries))
        raise RuntimeError("the caller rolls back")
    row = Job.objects.get()
    assert (row.state, row.claim_token, row.lease_expires_at) == ("pending", 0, None)  # neither call committed
