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

from lockkit.claims import (
    StaleClaim,
    claim_next,
    complete,
    complete_many,
    heartbeat,
    reclaim_expired,
    release,
)
from lockkit.errors import LockTimeout
from lockkit.testing import hold_lock
from lockkit_harness.proxy import Action, FaultProxy
from lockkit_tests.models import Job
from lockkit_tests.support.claims_helpers import expire

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
    assert message.startswith(OPENING), message
    assert message.endswith("; COMMIT"), message
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
    # Other sessions of the server (another suite, autoanalyze) may take ids meanwhile: a window in which no one
    # else did shows the poll took none; a poll that took one would show in every window. The windows are one poll
    # each (under a millisecond), so a busy server still leaves some of them quiet.
    for _ in range(200):
        before = _next_xid()
        assert claim_next(empty, worker="w", lease=30) == []
        if _next_xid() == before:
            break
    else:
        pytest.fail("every one of 200 empty polls saw a transaction id assigned")
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
    assert (row.state, row.claim_token, row.lease_expires_at) == (
        "pending",
        0,
        None,
    )  # neither call committed


# -- a reply lost after the message went: resolved from the rows, and the next call works ---------------------------


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_a_claim_next_whose_reply_was_lost_returns_the_claims_it_made(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Job.objects.bulk_create([Job(name="a"), Job(name="b"), Job(name="c")])
    proxy.arm("deliver")  # the server runs the whole message, COMMIT included; its reply is cut
    claimed = claim_next(Job.objects.using(alias).order_by("pk"), worker="w", lease=30, limit=2, fetch=True)
    assert proxy.cuts["deliver"] == 1
    rows = {job.pk: job for job in Job.objects.all()}
    # Exactly the rows the lost message claimed, each once, as working claims and instances.
    assert sorted(c.pk for _, c in claimed) == sorted(pk for pk, job in rows.items() if job.claim_token == 1)
    assert len(claimed) == 2
    for job, made in claimed:
        assert (made.worker, made.token) == ("w", rows[made.pk].claim_token)
        assert (job.pk, job.claimed_by, job.claim_token) == (made.pk, "w", 1)
        complete(made, set={"state": "done"})  # the claims work: fenced writes pass
    # The next call in the same process works, on a new connection.
    (last,) = claim_next(Job.objects.using(alias).filter(state="pending"), worker="w", lease=30)
    assert rows[last.pk].claim_token == 0
    assert sorted(Job.objects.values_list("claim_token", flat=True)) == [1, 1, 1]


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_a_claim_next_that_never_reached_the_server_is_tried_again(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Job.objects.create(name="a")
    proxy.arm("abort")  # the message is never forwarded: nothing happened on the server
    (made,) = claim_next(Job.objects.using(alias), worker="w", lease=30)
    assert proxy.cuts["abort"] == 1
    row = Job.objects.get()
    assert (row.claimed_by, row.claim_token, made.token) == ("w", 1, 1)  # claimed once, by the second try


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
@pytest.mark.parametrize("action", ["deliver", "abort"])
def test_a_release_whose_reply_was_lost_is_resolved_from_the_row(
    through_proxy: tuple[str, FaultProxy], action: Action
) -> None:
    alias, proxy = through_proxy
    Job.objects.create(name="a")
    (made,) = claim_next(Job.objects.using(alias), worker="w", lease=30)
    proxy.arm(action)  # deliver: it committed, the reply is cut; abort: it never reached the server
    release(made, set={"state": "pending"})  # done either way: no error, one write
    assert proxy.cuts[action] == 1
    row = Job.objects.get()
    assert (row.lease_expires_at, row.claim_token, row.state) == (None, 1, "pending")


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_the_claims_of_a_lost_reply_come_back_in_the_order_asked(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Job.objects.bulk_create([Job(name=str(n)) for n in range(5)])
    pks = sorted(Job.objects.values_list("pk", flat=True))
    proxy.arm("deliver")
    claimed = claim_next(Job.objects.using(alias), worker="w", lease=30, limit=3, order_by=["-pk"])
    assert proxy.cuts["deliver"] == 1
    assert [c.pk for c in claimed] == pks[::-1][:3]


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_a_lost_completion_is_done_when_the_row_holds_the_value_as_its_column_stores_it(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Job.objects.create(name="a")
    (made,) = claim_next(Job.objects.using(alias), worker="w", lease=30)
    proxy.arm("deliver")
    complete(made, set={"result": 5})  # the column stores "5": the row says the lost statement committed
    assert proxy.cuts["deliver"] == 1
    row = Job.objects.get()
    assert (row.result, row.lease_expires_at) == ("5", None)


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_a_lost_complete_many_with_a_stale_claim_is_stale_not_unknown(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    first, second = claim_next(Job.objects.using(alias).order_by("pk"), worker="w", lease=30, limit=2)
    complete(second)  # ended: the pair can no longer be ended together
    proxy.arm("abort")  # the statement never reaches the server
    with pytest.raises(StaleClaim) as raised:
        complete_many([first, second], set={"state": "done"})
    assert proxy.cuts["abort"] == 1
    assert [c.pk for c in raised.value.claims] == [second.pk]
    assert Job.objects.get(pk=first.pk).lease_expires_at is not None  # written nothing: all rows or none
