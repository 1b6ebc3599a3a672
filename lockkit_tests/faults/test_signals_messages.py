"""A signal handler's exception inside lockkit's own messages (``locked_update``, ``guarded_update``, claims).

The handler raises in the main thread while psycopg waits for the reply; the server would go on waiting and then
hold the row (or commit behind the caller's back). lockkit cancels the statement on the server, discards the
connection, and decides a message that carried its ``COMMIT``: the next call in the same process works.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.models import F

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
    """What a task runner's signal handler raises."""


@pytest.fixture
def time_limit() -> Iterator[None]:
    def raise_time_limit(signum: int, frame: Any) -> None:
        raise TimeLimitExceeded("soft time limit")

    previous = signal.signal(signal.SIGUSR1, raise_time_limit)
    yield
    signal.signal(signal.SIGUSR1, previous)


def _signal_main_when_blocked_by(holder: int) -> ThreadCall[None]:
    main = threading.main_thread().ident
    assert main is not None

    def send() -> None:
        wait_until_blocked(holder, timeout=JOIN)
        signal.pthread_kill(main, signal.SIGUSR1)

    return in_thread(send)


CALLS: dict[str, Callable[[], object]] = {
    "locked_update": lambda: lockkit.locked_update(
        Stock.objects.filter(sku="widget"), lambda row: {"available": row.available - 1}, lock_timeout=20
    ),
    "guarded_update": lambda: lockkit.guarded_update(
        Stock.objects.filter(sku="widget", available__gte=1), available=F("available") - 1, lock_timeout=20
    ),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_time_limit_in_the_row_wait_cancels_it_and_the_next_call_works(time_limit: None, name: str) -> None:
    stock = Stock.objects.create(sku="widget", available=5)
    call = CALLS[name]
    connection.ensure_connection()
    session = backend_pid()
    with hold_lock(stock) as holder:
        sender = _signal_main_when_blocked_by(holder.pid)
        with pytest.raises(TimeLimitExceeded) as raised:
            call()
        sender.result(JOIN)
        wait_until_gone("default", session)  # cancelled and discarded: it neither waits on nor takes the row
    assert "committed" not in " ".join(getattr(raised.value, "__notes__", []))
    with hold_lock(stock, nowait=True):  # nobody holds the row
        pass
    assert Stock.objects.get().available == 5  # the interrupted call changed nothing
    call()  # the next call in the same process works, on a new session
    assert Stock.objects.get().available == 4
