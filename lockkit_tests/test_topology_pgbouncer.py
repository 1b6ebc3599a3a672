"""A real PgBouncer in transaction pooling mode in front of PostgreSQL (two server connections in all).

lockkit's timeouts are transaction-scoped (``set_config(..., true)``), so they apply inside the scope and
never reach the next client that gets the same server connection; locked operations and retries behave as
without a pooler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections, transaction
from django.db.models import F

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.testing import backend_pid, hold_lock, run_concurrently, wait_until_blocked
from lockkit_tests import topology
from lockkit_tests.models import Stock
from lockkit_tests.util import reserve_one_on

MISSING = topology.missing()
ALIAS = "pgbouncer"
JOIN = 30.0

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=f"no PgBouncer topology: {MISSING}"),
    pytest.mark.django_db(transaction=True, databases=["default", "primary", ALIAS]),
]


@pytest.fixture(autouse=True, scope="module")
def _stop_pgbouncer_after_module() -> Iterator[None]:
    yield
    topology.stop_pgbouncer()


def bouncer_client() -> psycopg.Connection[Any]:
    """Another PgBouncer client; not autocommit, so its first query opens a transaction and keeps a server."""
    settings = connections[ALIAS].settings_dict
    return psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        dbname=settings["NAME"],
        prepare_threshold=None,
    )


def every_server_connection() -> dict[int, tuple[str, str]]:
    """``{backend pid: (lock_timeout, statement_timeout)}`` of every pooled server connection (new clients).

    Two clients each open a transaction at the same time, so between them they hold both server connections.
    """
    clients = [bouncer_client(), bouncer_client()]
    try:
        seen: dict[int, tuple[str, str]] = {}
        for client in clients:
            row = client.execute(
                "SELECT pg_backend_pid(), current_setting('lock_timeout'), "
                "current_setting('statement_timeout')"
            ).fetchone()
            assert row is not None
            seen[row[0]] = (row[1], row[2])
        return seen
    finally:
        for client in clients:
            client.rollback()
            client.close()


def show(name: str) -> str:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT current_setting(%s)", [name])
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


def test_scope_timeouts_apply_inside_and_never_reach_the_next_client_of_the_server_connection() -> None:
    with lockkit.locked(ALIAS, lock_timeout=0.25, statement_timeout=3) as scope:
        assert scope.alias == ALIAS
        assert (show("lock_timeout"), show("statement_timeout")) == ("250ms", "3s")
        with connections[ALIAS].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (server_pid,) = cursor.fetchone()
    seen = every_server_connection()
    assert server_pid in seen  # another client got the very server connection the scope ran on...
    assert seen[server_pid] == ("0", "0")  # ...with the server defaults, not the scope's values

    # The control: a session-level SET (what lockkit avoids) does reach the next client of that connection.
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid(), set_config('lock_timeout', '1234ms', false)")
        (leaky_pid, _) = cursor.fetchone()
    try:
        assert every_server_connection()[leaky_pid] == ("1234ms", "0")
    finally:
        with connections["primary"].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [leaky_pid])  # do not leave it to later tests


def test_lock_timeout_applies_through_the_pooler() -> None:
    Stock.objects.using("primary").create(sku="widget", available=1)
    with hold_lock(Stock.objects.filter(pk="widget"), using="primary"):
        started = time.monotonic()
        with pytest.raises(lockkit.LockTimeout) as caught, lockkit.locked(ALIAS, lock_timeout=0.3) as scope:
            scope.get(Stock, pk="widget")
        elapsed = time.monotonic() - started
    assert caught.value.sqlstate == "55P03"
    assert 0.3 <= elapsed < 3.0
    assert set(every_server_connection().values()) == {("0", "0")}


def test_waiter_through_the_pooler_decides_on_the_committed_value() -> None:
    Stock.objects.using("primary").create(sku="widget", available=1)
    locked_evt, release = threading.Event(), threading.Event()
    holder: dict[str, Any] = {}
    results: dict[str, Any] = {}

    def sell_last_unit() -> None:  # a direct session to the primary: locks, sells, waits, commits
        try:
            with transaction.atomic(using="primary"):
                holder["pid"] = backend_pid("primary")
                item = Stock.objects.using("primary").select_for_update().get(pk="widget")
                item.available = 0
                item.save(using="primary")
                locked_evt.set()
                assert release.wait(JOIN)
        except BaseException as exc:
            holder["error"] = exc
        finally:
            locked_evt.set()
            connections.close_all()

    def buyer() -> None:  # through PgBouncer
        try:
            with lockkit.locked(ALIAS, lock_timeout=10) as scope:
                results["seen"] = scope.get(Stock, pk="widget").available
        except BaseException as exc:
            results["error"] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sell_last_unit), threading.Thread(target=buyer)]
    threads[0].start()
    assert locked_evt.wait(JOIN)
    assert "error" not in holder, holder.get("error")
    threads[1].start()
    try:
        wait_until_blocked(holder["pid"], using="primary", timeout=10)
    finally:
        release.set()
        for thread in threads:
            thread.join(JOIN)
    assert not any(thread.is_alive() for thread in threads)
    assert "error" not in holder, holder.get("error")
    assert "error" not in results, results.get("error")
    assert results["seen"] == 0


def test_deadlock_is_retried_through_the_pooler() -> None:
    for sku in ("a", "b"):
        Stock.objects.using("primary").create(sku=sku, available=10)
    barrier = threading.Barrier(2)
    events: list[RetryEvent] = []

    @lockkit.locked_operation(
        ALIAS, retry=RetryPolicy(attempts=5, before_retry=events.append), lock_timeout=10
    )
    def move(first: str, second: str) -> int:
        scope = lockkit.current_scope()
        scope.get(Stock, pk=first)
        if scope.attempt == 1:
            barrier.wait(JOIN)
        scope.get(Stock, pk=second)
        Stock.objects.using(ALIAS).filter(pk=first).update(available=F("available") - 1)
        return scope.attempt

    outcomes = run_concurrently(move, 2, args=[("a", "b"), ("b", "a")], timeout=JOIN)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert sorted(o.result for o in outcomes if o.result is not None) == [1, 2]
    assert [(e.failure, e.sqlstate) for e in events] == [(Failure.DEADLOCK_DETECTED, "40P01")]
    assert dict(Stock.objects.using("primary").values_list("sku", "available")) == {"a": 9, "b": 9}


def test_no_oversell_through_the_pooler() -> None:
    Stock.objects.using("primary").create(sku="widget", available=3)
    reserve = reserve_one_on(ALIAS)

    outcomes = run_concurrently(reserve, 6, timeout=JOIN)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert sum(1 for o in outcomes if o.result) == 3
    assert Stock.objects.using("primary").get(pk="widget").available == 0


def test_a_session_advisory_lock_through_transaction_pooling_is_reported_lost() -> None:
    """PgBouncer hands out a server connection per transaction: a session-level lock stays on the server connection
    that took it, which the next client gets, while the block's own release lands elsewhere."""
    client = bouncer_client()
    held_pid = 0
    try:
        with pytest.raises(lockkit.AdvisoryLockLost, match="pooler") as caught:
            with lockkit.advisory_lock("cron:pooled", using=ALIAS, session=True) as held:
                assert held.pid is not None
                held_pid = held.pid
                # PgBouncer reuses the server connection released last: the one holding the lock.
                row = client.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                assert row[0] == held_pid
        assert caught.value.alias == ALIAS
    finally:
        client.rollback()
        client.close()
        if held_pid:
            with connections["primary"].cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [held_pid])  # drop the stranded lock
