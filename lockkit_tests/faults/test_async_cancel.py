"""A cancelled awaiting caller never leaves work committing behind its back (issue 23, item 7).

The caller's task is cancelled (a client disconnect, ``asyncio.timeout``) while ``.acall()`` runs on its thread:
before the COMMIT, the statement in flight is cancelled on the server, the transaction rolls back and nothing
commits; after the COMMIT was sent, the caller is told the outcome, not a plain cancellation.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import lockkit
from lockkit import RetryPolicy, aio, signals
from lockkit.testing import backend_pid, hold_lock, wait_until_blocked
from lockkit_harness.proxy import FaultProxy
from lockkit_tests.models import Stock

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
JOIN = 30.0


async def _off_loop(func: Any, *args: Any) -> Any:
    return await asyncio.wait_for(asyncio.to_thread(func, *args), JOIN)


@pytest.fixture
def finished() -> Iterator[list[dict[str, Any]]]:
    """Each ``operation_finished`` sent during the test (the thread's call ended: its error, its attempts)."""
    calls: list[dict[str, Any]] = []
    ended = threading.Condition()

    def receiver(sender: object, **kwargs: Any) -> None:
        with ended:
            calls.append(kwargs)
            ended.notify_all()

    signals.operation_finished.connect(receiver, weak=False, dispatch_uid="test_async_cancel")
    yield calls
    signals.operation_finished.disconnect(dispatch_uid="test_async_cancel")


async def _ended(calls: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """Wait (bounded, off the loop) until ``count`` operations have finished in their threads."""

    def wait() -> None:
        deadline = time.monotonic() + JOIN
        while len(calls) < count:
            assert time.monotonic() < deadline, f"only {len(calls)} of {count} calls ended"
            time.sleep(0.005)

    await _off_loop(wait)
    return calls


def _reservation(alias: str = "default", **options: Any):  # type: ignore[no-untyped-def]
    seen: dict[str, Any] = {"sent": [], "pids": [], "in_body": threading.Event(), "go_on": threading.Event()}

    @lockkit.locked_operation(alias, **options)
    def reserve(wait_in_body: bool = False) -> int:
        scope = lockkit.current_scope()
        seen["pids"].append(backend_pid(alias))
        row = scope.get(Stock, pk="widget")
        if wait_in_body:
            seen["in_body"].set()
            assert seen["go_on"].wait(JOIN)  # the body's "external call", while the caller goes away
        row.available -= 1
        row.save(using=alias)
        scope.on_commit(lambda: seen["sent"].append("e-mail"))
        return row.available

    return reserve, seen


def test_a_caller_cancelled_during_a_lock_wait_cancels_the_wait_and_commits_nothing(
    finished: list[dict[str, Any]],
) -> None:
    stock = Stock.objects.create(sku="widget", available=10)
    reserve, seen = _reservation(retry=RetryPolicy(attempts=5))

    async def scenario() -> None:
        with hold_lock(stock) as holder:
            task = asyncio.create_task(reserve.acall())
            await _off_loop(lambda: wait_until_blocked(holder.pid, timeout=JOIN))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The wait was cancelled on the server (not left to take the row once the holder lets go).
            (cancelled,) = await _ended(finished, 1)
        assert type(cancelled["error"]).__name__ == "CallCancelled"
        assert cancelled["attempts"] == 1  # not retried
        assert await reserve.acall() == 9  # the next call in the same process works: 10 - 1, nothing else

    asyncio.run(scenario())
    assert Stock.objects.get().available == 9
    assert seen["sent"] == ["e-mail"]  # the second call's only
    assert len(seen["pids"]) == 2  # the cancelled call was not retried


def test_a_caller_cancelled_while_the_body_runs_outside_the_database_commits_nothing(
    finished: list[dict[str, Any]],
) -> None:
    Stock.objects.create(sku="widget", available=10)
    reserve, seen = _reservation()

    async def scenario() -> None:
        task = asyncio.create_task(reserve.acall(wait_in_body=True))
        assert await _off_loop(seen["in_body"].wait, JOIN)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seen["go_on"].set()  # the body carries on in its thread, and reaches the COMMIT it must not send
        (ended,) = await _ended(finished, 1)
        assert type(ended["error"]).__name__ == "CallCancelled"

    asyncio.run(scenario())
    assert Stock.objects.get().available == 10
    assert seen["sent"] == []


def test_asyncio_timeout_around_acall_is_a_timeout_and_nothing_commits(
    finished: list[dict[str, Any]],
) -> None:
    stock = Stock.objects.create(sku="widget", available=10)
    reserve, seen = _reservation(lock_timeout=20)

    async def scenario() -> None:
        with hold_lock(stock):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await reserve.acall()
        (ended,) = await _ended(finished, 1)  # the holder has let go: an uncancelled wait would now commit
        assert type(ended["error"]).__name__ == "CallCancelled"

    asyncio.run(scenario())
    assert Stock.objects.get().available == 10
    assert seen["sent"] == []


def test_a_caller_cancelled_after_commit_was_sent_gets_the_committed_result(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=10)
    reserve, seen = _reservation(alias, retry=RetryPolicy(reconnect_within=15))

    def cut_commit_reply_and_refuse_reconnects() -> None:
        proxy.refuse_new = True
        proxy.arm("deliver")

    async def scenario() -> int:
        task = asyncio.create_task(reserve.acall(wait_in_body=True))
        assert await _off_loop(seen["in_body"].wait, JOIN)
        cut_commit_reply_and_refuse_reconnects()
        seen["go_on"].set()
        deadline = time.monotonic() + JOIN
        while proxy.cuts["deliver"] == 0:  # the COMMIT went through and its reply was cut
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        task.cancel()  # while lockkit cannot reconnect to resolve the COMMIT
        proxy.refuse_new = False
        left: int = await task
        return left

    assert asyncio.run(scenario()) == 9  # committed: the caller is told so, not "cancelled"
    assert Stock.objects.get().available == 9
    assert seen["sent"] == ["e-mail"]


def test_a_caller_cancelled_while_its_commit_was_held_and_then_aborted_is_cancelled_and_not_retried(
    through_proxy: tuple[str, FaultProxy], finished: list[dict[str, Any]]
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=10)
    reserve, seen = _reservation(alias, retry=RetryPolicy(reconnect_within=15))

    async def scenario() -> None:
        task = asyncio.create_task(reserve.acall(wait_in_body=True))
        assert await _off_loop(seen["in_body"].wait, JOIN)
        proxy.arm("hold")
        seen["go_on"].set()
        deadline = time.monotonic() + JOIN
        while proxy.cuts["hold"] == 0:  # the COMMIT was sent, and is held
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        task.cancel()
        await _off_loop(proxy.release_held)  # the server rolls the held transaction back
        with pytest.raises(asyncio.CancelledError):
            await task
        (ended,) = await _ended(finished, 1)
        assert type(ended["error"]).__name__ == "CallCancelled"

    asyncio.run(scenario())
    assert Stock.objects.get().available == 10
    assert seen["sent"] == []
    assert len(seen["pids"]) == 1  # the aborted COMMIT was not retried after the caller left


def test_a_caller_cancelled_after_commit_waits_as_long_as_the_policy_resolves(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    """The server is unreachable for longer than lockkit's default 10 s wait but within the policy's
    ``reconnect_within``: the thread confirms the COMMIT, and the cancelled caller is told so. Before, it got
    ``CommitOutcomeUnknown`` after a fixed 10 s for a transaction the server could confirm (issue 23, items 2, 7)."""
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=10)
    reserve, seen = _reservation(alias, retry=RetryPolicy(reconnect_within=25))
    outage = (
        aio.COMMIT_OUTCOME_WAIT + 1.0
    )  # the restart the caller rides out (a scenario's length, not a sync)

    async def scenario() -> int:
        task = asyncio.create_task(reserve.acall(wait_in_body=True))
        assert await _off_loop(seen["in_body"].wait, JOIN)
        proxy.refuse_new = True
        proxy.arm("deliver")
        seen["go_on"].set()
        deadline = time.monotonic() + JOIN
        while proxy.cuts["deliver"] == 0:  # the COMMIT went through and its reply was cut
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        task.cancel()
        back = time.monotonic() + outage
        while time.monotonic() < back and not task.done():
            await asyncio.sleep(0.05)
        proxy.refuse_new = False
        left: int = await task
        return left

    assert asyncio.run(scenario()) == 9  # committed, confirmed after the outage: not "unknown"
    assert Stock.objects.get().available == 9
    assert seen["sent"] == ["e-mail"]


def test_a_caller_cancelled_during_locked_updates_row_wait_cancels_it_and_never_calls_change(
    finished: list[dict[str, Any]],
) -> None:
    stock = Stock.objects.create(sku="widget", available=10)
    calls: list[int] = []

    def change(row: Stock) -> dict[str, int]:
        calls.append(row.available)
        return {"available": row.available - 1}

    async def scenario() -> None:
        with hold_lock(stock) as holder:
            task = asyncio.create_task(
                lockkit.alocked_update(Stock.objects.filter(sku="widget"), change, lock_timeout=20)
            )
            await _off_loop(lambda: wait_until_blocked(holder.pid, timeout=JOIN))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The wait was cancelled on the server while the holder still holds the row.
            (cancelled,) = await _ended(finished, 1)
        assert type(cancelled["error"]).__name__ == "CallCancelled"
        row = await lockkit.alocked_update(Stock.objects.filter(sku="widget"), change)  # the next call works
        assert row.available == 9

    asyncio.run(scenario())
    assert calls == [10]  # only the second call's change() ran
    assert Stock.objects.get().available == 9
