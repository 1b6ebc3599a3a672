"""A connection the server ended while it sat idle is noticed before lockkit's own messages are sent into it.

A terminated backend (or a restarted server) leaves its farewell on the idle connection's socket. Sending the next
message into it would make the reply "lost" after sending, an unknown outcome for a one-message call. lockkit reads
the waiting input first (``PQconsumeInput`` through psycopg's ``pgconn``), reconnects, and sends the call once.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from django.db.models import F

import lockkit
from lockkit.claims import claim_next, complete
from lockkit_harness.sessions import session_of, terminate
from lockkit_tests.models import Job, Stock

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
