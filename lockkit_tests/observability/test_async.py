"""``locked_operation(...).acall`` and the awaitable claims functions, under real contention.

Each simulated request runs in its own ``asgiref.sync.ThreadSensitiveContext``, as Django's ASGI handler runs each
request, so two concurrent awaits run on two threads with two connections and really contend in the database.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from asgiref.sync import ThreadSensitiveContext, async_to_sync
from django.db import connection, transaction

import lockkit
from lockkit import Failure, RetryPolicy, signals
from lockkit.claims import aclaim_next, acomplete, areclaim_expired
from lockkit.testing import backend_pid, hold_lock, wait_until_blocked
from lockkit_tests.models import Job, Stock

pytestmark = pytest.mark.contention
JOIN = 30.0
T = TypeVar("T")


async def in_request(call: Coroutine[Any, Any, T]) -> T:
    """Await ``call`` as one ASGI request does: in a thread-sensitive context of its own."""
    async with ThreadSensitiveContext():
        return await call


async def in_thread(func: Any, *args: Any) -> Any:
    return await asyncio.wait_for(asyncio.to_thread(func, *args), JOIN)


def sessions_alive(pids: list[int]) -> list[int]:
    """The given server sessions still connected, waiting (bounded) for closed ones to leave pg_stat_activity."""
    deadline = time.monotonic() + 10
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
            alive = [row[0] for row in cursor.fetchall()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


def test_two_concurrent_awaits_on_one_row_one_waits_and_is_retried_both_correct() -> None:
    Stock.objects.create(sku="widget", available=2)
    holding, release, retried = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, dict[str, Any]] = {"first": {}, "second": {}}

    @lockkit.locked_operation(retry=RetryPolicy(attempts=5, wait_initial=0.01), lock_timeout=0.3)
    def reserve(sku: str, who: str) -> tuple[int, int]:
        scope = lockkit.current_scope()
        record = seen[who]
        record["pid"], record["thread"] = backend_pid(), threading.get_ident()
        stock = scope.get(Stock, pk=sku)
        if who == "first":
            holding.set()
            assert release.wait(JOIN)  # hold the row until the test has seen the second wait and retry
        stock.available -= 1
        stock.save(update_fields=["available"])
        scope.on_commit(lambda: record.setdefault("committed_on", threading.get_ident()))
        return scope.attempt, stock.available

    def on_retry(sender: object, **kwargs: Any) -> None:
        if sender is reserve:
            seen["second"].setdefault("retry", (kwargs["attempt"], kwargs["failure"]))
            retried.set()

    async def scenario() -> tuple[tuple[int, int], tuple[int, int]]:
        first = asyncio.create_task(in_request(reserve.acall("widget", "first")))
        assert await in_thread(holding.wait, JOIN)
        second = asyncio.create_task(in_request(reserve.acall("widget", who="second")))
        blocked = await in_thread(lambda: wait_until_blocked(seen["first"]["pid"], timeout=JOIN))
        seen["second"]["blocked"] = blocked
        assert await in_thread(retried.wait, JOIN)  # its first attempt timed out while the first held the row
        release.set()
        return await asyncio.wait_for(asyncio.gather(first, second), JOIN)

    signals.operation_retried.connect(on_retry, weak=False)
    try:
        (first_attempt, first_left), (second_attempt, second_left) = asyncio.run(scenario())
    finally:
        release.set()
        signals.operation_retried.disconnect(on_retry)

    first, second = seen["first"], seen["second"]
    assert second["blocked"] == [second["pid"]]  # the second await's session waited for the first's lock
    assert second["retry"] == (1, Failure.LOCK_TIMEOUT)
    assert (first_attempt, first_left) == (1, 1)
    assert second_attempt >= 2
    assert second_left == 0
    assert Stock.objects.get(pk="widget").available == 0
    # One thread per request, never the event loop's; on_commit ran on the thread of the body.
    assert first["thread"] != second["thread"]
    assert threading.get_ident() not in (first["thread"], second["thread"])
    assert (first["committed_on"], second["committed_on"]) == (first["thread"], second["thread"])
    # The worker threads' connections were closed when each call ended (CONN_MAX_AGE = 0).
    assert sessions_alive([first["pid"], second["pid"]]) == []


def test_acall_raises_the_classified_error_with_attempts() -> None:
    Stock.objects.create(sku="widget", available=1)

    @lockkit.locked_operation(retry=RetryPolicy(attempts=2), nowait=True)
    def take(sku: str) -> int:
        return lockkit.current_scope().get(Stock, pk=sku).available

    with hold_lock(Stock.objects.get(pk="widget")), pytest.raises(lockkit.LockNotAvailable) as caught:
        asyncio.run(in_request(take.acall("widget")))
    assert (caught.value.sqlstate, caught.value.attempts) == ("55P03", 1)  # NOWAIT is not retried


def test_an_async_def_is_refused_pointing_to_acall() -> None:
    async def reserve() -> None:  # pragma: no cover - never called
        pass

    with pytest.raises(TypeError, match=r"await func\.acall\(\.\.\.\)"):
        lockkit.locked_operation(reserve)


def test_awaitable_claims_claim_complete_and_reclaim() -> None:
    Job.objects.bulk_create([Job(name=f"j{i}") for i in range(3)])

    async def worker() -> tuple[int, int]:
        claims = await aclaim_next(Job.objects.filter(state="pending"), worker="w", lease=30, limit=2)
        for claim in claims:
            await acomplete(claim, set={"state": "done"})
        return len(claims), await areclaim_expired(Job.objects.all(), set={"state": "pending"})

    assert asyncio.run(in_request(worker())) == (2, 0)
    assert sorted(Job.objects.values_list("state", flat=True)) == ["done", "done", "pending"]


@pytest.mark.django_db(transaction=True)
def test_acall_inside_an_outer_atomic_runs_nested_on_that_thread_and_keeps_its_connection() -> None:
    attempts: list[int] = []

    @lockkit.locked_operation(retry=RetryPolicy(attempts=3))
    def take(sku: str) -> int:
        scope = lockkit.current_scope()
        attempts.append(scope.attempt)
        assert scope.nested  # a savepoint in the caller's transaction
        return scope.get(Stock, pk=sku).available

    with transaction.atomic():
        Stock.objects.create(sku="inner", available=4)  # visible only inside this transaction
        pid = backend_pid()
        # async_to_sync from this thread: thread-sensitive work comes back to this thread and its connection.
        assert async_to_sync(take.acall)("inner") == 4
        assert connection.in_atomic_block
        assert backend_pid() == pid  # the same session, not closed by the call
    assert attempts == [1]
