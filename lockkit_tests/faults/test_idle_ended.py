"""A connection the server ended while it sat idle is noticed before lockkit's own messages are sent into it.

A terminated backend (or a restarted server) leaves its farewell on the idle connection's socket. Sending the next
message into it would make the reply "lost" after sending, an unknown outcome for a one-message call. lockkit reads
the waiting input first (``PQconsumeInput`` through psycopg's ``pgconn``), reconnects, and sends the call once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection, connections
from django.db.models import F

import lockkit
from lockkit.claims import claim_next, complete
from lockkit_harness.sessions import session_of, terminate
from lockkit_tests.models import Job, Stock
from lockkit_tests.support.faultkit import proxied

pytestmark = pytest.mark.django_db(transaction=True)


def _end_this_threads_session() -> int:
    connection.ensure_connection()
    pid = session_of("default")
    ended: list[bool] = []

    def end() -> None:  # from another thread (its own connection), waiting until the session is gone
        try:
            ended.append(terminate("default", pid))
        finally:
            connections.close_all()

    worker = threading.Thread(target=end)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert ended == [True]
    return pid


def test_guarded_update_on_an_idle_connection_the_server_ended_runs_once() -> None:
    Stock.objects.create(sku="a", available=5)
    old = _end_this_threads_session()
    (row,) = lockkit.guarded_update(
        Stock.objects.filter(pk="a", available__gte=1), available=F("available") - 1
    )
    assert row.available == 4
    assert Stock.objects.get().available == 4  # exactly once
    assert session_of("default") != old  # a new session


def test_locked_update_on_an_idle_connection_the_server_ended_runs_once() -> None:
    Stock.objects.create(sku="a", available=5)
    calls: list[int] = []

    def change(row: Stock) -> dict[str, int]:
        calls.append(row.available)
        return {"available": row.available - 1}

    old = _end_this_threads_session()
    assert lockkit.locked_update(Stock.objects.filter(sku="a"), change).available == 4
    assert calls == [5]
    assert Stock.objects.get().available == 4
    assert session_of("default") != old


def test_a_claims_call_on_an_idle_connection_the_server_ended_claims_once() -> None:
    Job.objects.create(name="one")
    _end_this_threads_session()
    (claimed,) = claim_next(Job.objects.all(), worker="w", lease=30)
    assert Job.objects.get().claim_token == claimed.token
    complete(claimed)
    assert Job.objects.get().lease_expires_at is None  # completed: the claim ended


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_a_farewell_that_arrives_before_the_end_of_the_stream_is_noticed() -> None:
    # The server's farewell error reaches the idle connection while its end does not yet (the proxy holds it):
    # the farewell alone says the session is over. Sent into it, the call would meet the farewell as its reply,
    # after its COMMIT went: an unknown outcome for a call that provably did nothing.
    Stock.objects.create(sku="a", available=5)
    with proxied("default") as (alias, proxy):
        proxy.late_hangup = True
        rows = Stock.objects.using(alias)
        assert rows.get().available == 5  # connected through the proxy
        old = session_of(alias)
        assert terminate("default", old)
        _wait_for(lambda: proxy.server_hangups == 1)
        (row,) = lockkit.guarded_update(rows.filter(pk="a", available__gte=1), available=F("available") - 1)
        assert row.available == 4
        assert session_of(alias) != old  # a new session
    assert Stock.objects.get().available == 4  # exactly once


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_a_scope_on_an_idle_connection_whose_farewell_arrived_reconnects_first() -> None:
    Stock.objects.create(sku="a", available=5)
    with proxied("default") as (alias, proxy):
        proxy.late_hangup = True
        assert Stock.objects.using(alias).get().available == 5
        old = session_of(alias)
        assert terminate("default", old)
        _wait_for(lambda: proxy.server_hangups == 1)
        with lockkit.locked(alias) as scope:
            row = scope.get(Stock.objects.using(alias), pk="a")
            row.available -= 1
            row.save(using=alias)
        assert session_of(alias) != old
    assert Stock.objects.get().available == 4


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Return once ``condition()`` holds (the proxy's own count, read every 10 ms), or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the proxy did not see the server hang up"
        time.sleep(0.01)
