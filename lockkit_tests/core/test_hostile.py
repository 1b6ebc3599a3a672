"""Hostile and careless use of the features that landed together: each test pins a bug found and fixed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from asgiref.sync import ThreadSensitiveContext, async_to_sync
from django.db import DataError, connections, transaction
from django.dispatch import Signal
from django.test.utils import CaptureQueriesContext

import lockkit
import lockkit.inspection
from lockkit import signals
from lockkit.claims import claim_next
from lockkit.testing import blocked_by, hold_lock, in_thread, run_concurrently, wait_until_blocked
from lockkit_tests.models import Job, Stock
from lockkit_tests.support import vendors


class MetricsDown(Exception):
    pass


@contextmanager
def broken_receivers(*names: str) -> Iterator[list[str]]:
    """Connect a receiver raising ``MetricsDown`` to each named signal; yield the names of those that ran."""
    ran: list[str] = []
    connected: list[tuple[Signal, Any]] = []
    for name in names:
        signal: Signal = getattr(signals, name)

        def receiver(sender: object, *, _name: str = name, **kwargs: Any) -> None:
            ran.append(_name)
            raise MetricsDown(_name)

        signal.connect(receiver, weak=False)
        connected.append((signal, receiver))
    try:
        yield ran
    finally:
        for signal, receiver in connected:
            signal.disconnect(receiver)


OPERATION_SIGNALS = ("operation_started", "attempt_started", "attempt_finished", "operation_finished")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", [*OPERATION_SIGNALS, "lock_acquired"])
def test_a_raising_receiver_never_fails_or_rolls_back_the_operation(name: str) -> None:
    Stock.objects.create(sku="s", available=5)
    calls: list[int] = []

    @lockkit.locked_operation
    def reserve() -> int:
        calls.append(1)
        stock = lockkit.current_scope().get(Stock, pk="s")
        stock.available -= 1
        stock.save()
        return stock.available

    with broken_receivers(name) as ran:
        assert reserve() == 4
    assert ran == [name]
    assert calls == [1]  # not retried, not re-run
    assert Stock.objects.get(pk="s").available == 4  # committed


@pytest.mark.django_db(transaction=True)
def test_a_raising_claim_receiver_does_not_lose_the_claim() -> None:
    Job.objects.create(state="ready")
    with broken_receivers("claim_made") as ran:
        claims = claim_next(Job.objects.all(), worker="w1", lease=60)
    assert ran == ["claim_made"]
    assert len(claims) == 1
    assert Job.objects.get().claimed_by == "w1"


def advisory_locks_held(alias: str = "default") -> int:
    """Advisory locks the thread's own session holds (``pg_locks``)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.django_db(transaction=True)
def test_a_session_lock_in_an_aborted_atomic_block_is_not_left_on_the_connection() -> None:
    with pytest.raises(DataError), transaction.atomic():
        with lockkit.advisory_lock("hostile-session", session=True):
            assert advisory_locks_held() == 1
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT 1 / 0")  # aborts the transaction: the release cannot run in it
    # The connection is reused by this thread: no session-level lock may stay on it.
    assert advisory_locks_held() == 0


def db_sessions(timeout: float = 10.0) -> list[tuple[int, str, str]]:
    """Other sessions on the test database: (pid, state, query), waiting (bounded) for closing ones to leave."""
    deadline = time.monotonic() + timeout
    while True:
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT pid, state, query FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            found = [(int(pid), str(state), str(query)) for pid, state, query in cursor.fetchall()]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_acalls_on_one_row_are_exact_and_leave_no_session() -> None:
    Stock.objects.create(sku="hot", available=100)

    @lockkit.locked_operation(retry=lockkit.RetryPolicy(attempts=50, wait_initial=0.01), lock_timeout=2)
    def take_one() -> int:
        stock = lockkit.current_scope().get(Stock, pk="hot")
        stock.available -= 1
        stock.save()
        return stock.available

    async def request() -> int:
        async with ThreadSensitiveContext():
            return await take_one.acall()

    async def main() -> list[int]:
        return await asyncio.wait_for(asyncio.gather(*(request() for _ in range(20))), 60)

    left = async_to_sync(main)()
    assert sorted(left) == list(range(80, 100))
    assert Stock.objects.get(pk="hot").available == 80
    assert db_sessions() == []


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_acall_leaves_no_open_transaction_lock_or_session() -> None:
    stock = Stock.objects.create(sku="hot", available=5)

    @lockkit.locked_operation(retry=None, lock_timeout=20)
    def take_one() -> int:
        row = lockkit.current_scope().get(Stock, pk="hot")
        row.available -= 1
        row.save()
        return row.available

    async def main(holder: Any) -> None:
        async def request() -> int:
            async with ThreadSensitiveContext():
                return await take_one.acall()

        task = asyncio.ensure_future(request())
        await asyncio.to_thread(wait_until_blocked, holder, timeout=20)
        task.cancel()

        def cancelled_on_the_server() -> None:
            # The promise: the wait ends on the server (the statement is cancelled) while the holder still holds
            # the row; only then does the holder let go.
            deadline = time.monotonic() + 20
            while blocked_by(holder):
                assert time.monotonic() < deadline, "the cancelled call still waits for the row on the server"
                time.sleep(0.01)

        await asyncio.to_thread(cancelled_on_the_server)
        await asyncio.to_thread(holder.release)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 20)

    with hold_lock(stock) as holder:
        async_to_sync(main)(holder)
    # The cancelled call's lock wait was cancelled on the server and its transaction rolled back (issue 23, item
    # 7): once its thread has ended (its session gone, below), nothing of it committed, even though the holder let
    # go; and no transaction, lock or session is left open.
    assert db_sessions(timeout=30) == []
    assert Stock.objects.get(pk="hot").available == 5


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("session", [False, True])
def test_one_decorated_function_from_eight_threads_excludes_itself_and_leaves_no_lock(session: bool) -> None:
    Stock.objects.create(sku="hot", available=0)
    inside: list[int] = []
    overlaps: list[int] = []
    guard = threading.Lock()

    @lockkit.advisory_lock("hostile-8", session=session, lock_timeout=30)
    def bump() -> int:
        with guard:
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(len(inside))
        try:
            # A read-modify-write that loses updates unless the calls are serialised.
            stock = Stock.objects.get(pk="hot")
            time.sleep(0.001)
            Stock.objects.filter(pk="hot").update(available=stock.available + 1)
            return advisory_locks_held()
        finally:
            with guard:
                inside.pop()

    outcomes = run_concurrently(bump, 8, timeout=60)
    # Each call held exactly its own one lock.
    assert [(o.result, o.error) for o in outcomes] == [(1, None)] * 8
    assert overlaps == []
    assert Stock.objects.get(pk="hot").available == 8
    assert advisory_locks_held() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("session", [False, True])
def test_keyboard_interrupt_in_the_block_releases_the_lock(session: bool) -> None:
    with pytest.raises(KeyboardInterrupt):
        with lockkit.advisory_lock("hostile-kbd", session=session):
            assert advisory_locks_held() == 1
            raise KeyboardInterrupt
    assert advisory_locks_held() == 0
    assert not connections["default"].in_atomic_block


@pytest.mark.django_db(transaction=True)
def test_lock_all_refuses_a_none_primary_key_before_locking() -> None:
    Stock.objects.create(sku="s1", available=1)
    with lockkit.locked() as scope, CaptureQueriesContext(connections["default"]) as queries:
        with pytest.raises(ValueError, match=r"pks: None is not a valid Stock primary key"):
            scope.lock_all(Stock, pks=["s1", None])
    assert not [q for q in queries.captured_queries if "FOR UPDATE" in q["sql"]]


@pytest.mark.django_db(transaction=True)
def test_a_killed_session_lock_holder_raises_advisory_lock_lost_at_exit() -> None:
    with pytest.raises(lockkit.AdvisoryLockLost):
        with lockkit.advisory_lock("hostile-killed", session=True) as held:
            assert held.pid is not None
            signalled = in_thread(lockkit.inspection.terminate, held.pid).result(timeout=30)
            assert signalled.sent
    # The dead connection was discarded: the thread's next query runs on a new session holding nothing.
    assert advisory_locks_held() == 0


@pytest.mark.skipif(
    not vendors.MYSQL_CONFIGURED, reason=vendors.MYSQL_SKIP_REASON
)  # before django_db's setup
@pytest.mark.django_db(transaction=True, databases=["default", "mariadb"])
def test_a_killed_session_lock_holder_on_mariadb_raises_advisory_lock_lost() -> None:
    with pytest.raises(lockkit.AdvisoryLockLost):
        with lockkit.advisory_lock("hostile-killed", session=True, using="mariadb") as held:
            assert held.pid is not None
            assert in_thread(lockkit.inspection.terminate, held.pid, using="mariadb").result(timeout=30).sent
    name = held.key.lock_name(connections["mariadb"].settings_dict["NAME"])
    with connections["mariadb"].cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s)", [name])
        assert cursor.fetchone() == (None,)
