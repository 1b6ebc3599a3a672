"""An exception raised into a lock wait by a signal handler (issue 23, items 8 and 10).

Task runners enforce time limits with signals (Celery's soft time limit, RQ, ``SIGALRM`` handlers): the handler
raises in the main thread while psycopg waits for the reply, and the server goes on waiting and then holds the lock.
lockkit cancels the statement on the server and drops the connection; a session-level advisory lock interrupted
while being taken never outlives the block. Real signals (``pthread_kill``) to the main thread, which runs the test.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

import lockkit
from lockkit.testing import ThreadCall, backend_pid, hold_lock, in_thread, wait_until_blocked
from lockkit_tests.models import Stock
from lockkit_tests.support.faultkit import wait_until_gone

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default"]),
    pytest.mark.skipif(
        threading.current_thread() is not threading.main_thread(), reason="signals need the main thread"
    ),
]
JOIN = 30.0


class TimeLimitExceeded(Exception):
    """What a task runner's signal handler raises (Celery's SoftTimeLimitExceeded is an Exception too)."""


@pytest.fixture
def time_limit() -> Iterator[None]:
    previous = signal.signal(signal.SIGUSR1, _raise_time_limit)
    yield
    signal.signal(signal.SIGUSR1, previous)


def _raise_time_limit(signum: int, frame: Any) -> None:
    raise TimeLimitExceeded("soft time limit")


def _signal_main_when(blocked_by: int, signum: int) -> ThreadCall[None]:
    main = threading.main_thread().ident
    assert main is not None

    def send() -> None:
        wait_until_blocked(blocked_by, timeout=JOIN)
        signal.pthread_kill(main, signum)

    return in_thread(send)


def test_a_time_limit_raised_into_a_row_lock_wait_cancels_the_wait_on_the_server(time_limit: None) -> None:
    stock = Stock.objects.create(sku="widget", available=5)
    session = backend_pid()
    with hold_lock(stock) as holder:
        sender = _signal_main_when(holder.pid, signal.SIGUSR1)
        with pytest.raises(TimeLimitExceeded), lockkit.locked(lock_timeout=20) as scope:
            row = scope.get(Stock, pk="widget")
            row.available -= 1
            row.save()
        sender.result(JOIN)
        wait_until_gone("default", session)  # the session neither waits on nor takes the row once it is free
    # Nobody holds the row: another session locks it at once, and the interrupted update never happened.
    with hold_lock(stock, nowait=True):
        pass
    assert Stock.objects.get().available == 5
    with lockkit.locked() as scope:  # the next call in the same process works
        assert scope.get(Stock, pk="widget").available == 5


@pytest.mark.parametrize(
    ("signum", "raised"), [(signal.SIGUSR1, TimeLimitExceeded), (signal.SIGINT, KeyboardInterrupt)]
)
def test_an_interrupted_session_advisory_lock_never_outlives_the_block(
    time_limit: None, signum: int, raised: type[BaseException]
) -> None:
    holding, release = threading.Event(), threading.Event()
    holder_pid: list[int] = []

    def hold() -> None:
        with lockkit.advisory_lock("nightly", session=True):
            holder_pid.append(backend_pid())
            holding.set()
            assert release.wait(JOIN)
        connections["default"].close()

    holder = in_thread(hold)
    assert holding.wait(JOIN)
    session = backend_pid()
    sender = _signal_main_when(holder_pid[0], signum)
    try:
        with pytest.raises(raised), lockkit.advisory_lock("nightly", session=True, lock_timeout=20):
            pytest.fail("the lock was granted although another session held it")
        sender.result(JOIN)
    finally:
        release.set()
        holder.result(JOIN)
    wait_until_gone("default", session)  # dropped with its session, whatever the server granted it
    with lockkit.advisory_lock("nightly", session=True, nowait=True):  # free, and the next call works
        pass
