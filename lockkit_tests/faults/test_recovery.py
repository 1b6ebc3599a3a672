"""A lost connection leaves the process usable: the next lockkit call reconnects (issue 11, items 1 and 2).

Sessions are ended from another connection (``pg_terminate_backend``, ``KILL CONNECTION``) or by the server itself
(MariaDB's ``wait_timeout``), and the test asserts what the *next* call in the same thread does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError, connections, transaction
from django.test.utils import CaptureQueriesContext, override_settings

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.claims import (
    Claim,
    claim,
    claim_next,
    complete,
    complete_many,
    heartbeat,
    held_by,
    reclaim_expired,
    release,
    release_many,
)
from lockkit_harness.sessions import session_of, terminate
from lockkit_tests.models import Job, Stock
from lockkit_tests.support.claims_helpers import expire
from lockkit_tests.support.faultkit import ended_at_first_statement, wait_until_gone
from lockkit_tests.support.util import reserve_one_on
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON, vendor_params

# None: psycopg reports the closed socket without a code (the folded BEGIN reads no FATAL message first); the
# driver's state makes it a ConnectionLost all the same.
LOST_CODES: dict[str, set[str | None]] = {"postgresql": {"57P01", None}, "mysql": {"2006", "2013"}}


def _widgets(alias: str, available: int = 5) -> None:
    Stock.objects.using(alias).create(sku="widget", available=available)


def _available(alias: str) -> int:
    return Stock.objects.using(alias).get(pk="widget").available


@pytest.mark.parametrize("alias", vendor_params())
def test_locked_operation_retries_a_terminated_session_and_succeeds(alias: str) -> None:
    _widgets(alias)
    events: list[RetryEvent] = []
    reserve = reserve_one_on(alias)
    with override_settings(LOCKKIT={"RETRY": RetryPolicy(before_retry=events.append)}):
        assert reserve() is True
        with ended_at_first_statement(alias) as ended:
            assert (
                reserve() is True
            )  # attempt 1 fails on the dead session (before COMMIT), attempt 2 reconnects
        assert session_of(alias) != ended[0]
    assert [event.failure for event in events] == [Failure.CONNECTION_LOST]
    assert events[0].sqlstate in LOST_CODES[connections[alias].vendor]
    assert _available(alias) == 3


@pytest.mark.parametrize("alias", vendor_params())
def test_locked_raises_connection_lost_once_and_the_next_scope_works(alias: str) -> None:
    _widgets(alias)
    events: list[RetryEvent] = []
    with override_settings(LOCKKIT={"RETRY": RetryPolicy(before_retry=events.append)}):
        with (
            ended_at_first_statement(alias) as ended_at_entry,
            lockkit.locked(alias) as scope,
        ):  # at its opening
            assert scope.get(Stock, pk="widget").available == 5  # retried: entering reconnects
    assert [event.failure for event in events] == [Failure.CONNECTION_LOST]
    assert session_of(alias) != ended_at_entry[0]
    with lockkit.locked(alias) as scope:
        scope.get(Stock, pk="widget")
    # The session ends inside the block (a refusal at the opening is retried by locked() itself).
    with (
        pytest.raises(lockkit.ConnectionLost) as caught,
        lockkit.locked(alias) as scope,
        ended_at_first_statement(alias) as ended,
    ):
        scope.get(Stock, pk="widget")
    dead = ended[0]
    assert caught.value.sqlstate in LOST_CODES[connections[alias].vendor]
    assert caught.value.alias == alias
    assert isinstance(caught.value, OperationalError)
    assert lockkit.classify(caught.value) is Failure.CONNECTION_LOST
    with lockkit.locked(alias) as scope:  # the dead connection was discarded: this one reconnects
        row = scope.get(Stock, pk="widget")
        row.available -= 1
        row.save(using=alias)
    assert session_of(alias) != dead
    assert _available(alias) == 4


@pytest.mark.parametrize("alias", vendor_params())
def test_a_connection_django_saw_fail_outside_lockkit_is_discarded_before_the_next_scope(alias: str) -> None:
    """The wedge: an autocommit query failed on the dead session; Django keeps the dead connection object."""
    _widgets(alias)
    Stock.objects.using(alias).count()
    assert terminate(alias, session_of(alias))
    with pytest.raises(OperationalError):
        Stock.objects.using(alias).count()
    with pytest.raises(OperationalError):
        Stock.objects.using(alias).count()  # Django alone stays wedged
    with lockkit.locked(alias) as scope:  # discarded before the scope began: no error at all
        assert scope.get(Stock, pk="widget").available == 5
    assert Stock.objects.using(alias).count() == 1  # and plain Django works again too


@pytest.mark.parametrize("alias", vendor_params())
def test_inside_the_users_atomic_the_connection_is_left_to_the_user(alias: str) -> None:
    _widgets(alias)
    reserve = reserve_one_on(alias)
    with pytest.raises(lockkit.ConnectionLost):
        with transaction.atomic(using=alias):
            Stock.objects.using(alias).count()
            assert terminate(alias, session_of(alias))
            reserve()  # nested: one attempt, classified, no reconnect inside the user's transaction
    assert reserve() is True  # the user's atomic() ended; the next call reconnects
    assert _available(alias) == 4


@pytest.mark.django_db(transaction=True)
def test_the_healthy_path_runs_no_extra_query() -> None:
    _widgets("default")
    with lockkit.locked("default") as scope:
        scope.get(Stock, pk="widget")
    connection = connections["default"]
    with CaptureQueriesContext(connection) as queries, lockkit.locked("default") as scope:
        scope.get(Stock, pk="widget")
    statements = [
        query["sql"] for query in queries.captured_queries if query["sql"] not in ("BEGIN", "COMMIT")
    ]
    assert not any(sql.strip().upper() == "SELECT 1" for sql in statements)
    assert len(statements) == 2  # the scope's opening (timeouts and xid), then the locking SELECT
    assert (
        statements[0]
        == "BEGIN; SELECT set_config('lock_timeout', '5000ms', true), pg_current_xact_id()::text"
    )
    assert statements[1].endswith('FOR UPDATE OF "lockkit_tests_stock"')


@pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON)
@pytest.mark.django_db(transaction=True, databases=["default", "mariadb"])
def test_mariadb_server_has_gone_away_after_wait_timeout() -> None:
    alias = "mariadb"
    _widgets(alias)
    reserve = reserve_one_on(alias)
    assert reserve() is True
    with connections[alias].cursor() as cursor:
        cursor.execute("SET SESSION wait_timeout = 1")
    wait_until_gone(alias, session_of(alias))  # the server closed the idle session: "server has gone away"
    assert reserve() is True
    with connections[alias].cursor() as cursor:
        cursor.execute("SET SESSION wait_timeout = 1")
    wait_until_gone(alias, session_of(alias))
    events: list[RetryEvent] = []
    with override_settings(LOCKKIT={"RETRY": RetryPolicy(before_retry=events.append)}):
        with lockkit.locked(alias) as scope:  # its opening meets "server has gone away": entering reconnects
            assert scope.get(Stock, pk="widget").available == 3
    assert [event.sqlstate in {"2006", "2013"} for event in events] == [True]


# -- every claims call, after its session was terminated ------------------------------------------------------


def _claimed(worker: str = "w1") -> Claim:
    (found,) = claim_next(
        Job.objects.filter(state="pending"), worker=worker, lease=30, set={"state": "running"}
    )
    return found


def _prepare_claim() -> tuple[Any, ...]:
    job = Job.objects.filter(state="pending").first()
    assert job is not None
    return (job,)


def _call_claim(job: Job) -> Any:
    assert claim(job, worker="w1", lease=30, set={"state": "running"}) is not None
    return Job.objects.get(pk=job.pk).state


def _call_claim_next() -> Any:
    return Job.objects.get(pk=_claimed().pk).state


def _prepare_held() -> tuple[Any, ...]:
    return (_claimed(),)


def _prepare_expired() -> tuple[Any, ...]:
    expire(_claimed().pk)
    return ()


def _call_heartbeat(held: Claim) -> Any:
    renewed = heartbeat(held, lease=60)
    return renewed.lease_expires_at > held.lease_expires_at


def _call_complete(held: Claim) -> Any:
    complete(held, set={"state": "done"})
    return Job.objects.get(pk=held.pk).state


def _call_release(held: Claim) -> Any:
    release(held, set={"state": "pending"})
    return Job.objects.get(pk=held.pk).state


def _call_complete_many(held: Claim) -> Any:
    complete_many([held], set={"state": "done"})
    return Job.objects.get(pk=held.pk).state


def _call_release_many(held: Claim) -> Any:
    release_many([held], set={"state": "pending"})
    return Job.objects.get(pk=held.pk).state


def _call_reclaim_expired() -> Any:
    return reclaim_expired(Job.objects.filter(state="running"), set={"state": "pending"})


def _call_held_by(held: Claim) -> Any:
    return [found.pk for found in held_by(Job.objects.all(), worker="w1")] == [held.pk]


def _nothing() -> tuple[Any, ...]:
    return ()


CLAIMS_CALLS: list[tuple[str, Callable[[], tuple[Any, ...]], Callable[..., Any], Any]] = [
    # (name, preparation before the session is terminated, the call, its expected result)
    ("claim", _prepare_claim, _call_claim, "running"),
    ("claim_next", _nothing, _call_claim_next, "running"),
    ("heartbeat", _prepare_held, _call_heartbeat, True),
    ("complete", _prepare_held, _call_complete, "done"),
    ("release", _prepare_held, _call_release, "pending"),
    ("complete_many", _prepare_held, _call_complete_many, "done"),
    ("release_many", _prepare_held, _call_release_many, "pending"),
    ("reclaim_expired", _prepare_expired, _call_reclaim_expired, 1),
    ("held_by", _prepare_held, _call_held_by, True),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("prepare", "call", "expected"),
    [pytest.param(prepare, call, expected, id=name) for name, prepare, call, expected in CLAIMS_CALLS],
)
def test_every_claims_call_works_right_after_its_session_was_terminated(
    prepare: Callable[[], tuple[Any, ...]], call: Callable[..., Any], expected: Any
) -> None:
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    args = prepare()
    dead = session_of("default")
    assert terminate("default", dead)
    # Before COMMIT nothing was written: the call reconnects and runs again, inside the call.
    assert call(*args) == expected
    assert session_of("default") != dead
