"""A time limit raised by a signal handler into a MariaDB lock wait reaches the caller as itself (issue 23, item 8).

mysqlclient runs the handler once the server's reply has arrived, before the result is read: the exception leaves
the statement, and Django's cursor cleanup then fails with 2014 "Commands out of sync", which hid the time limit (a
task runner's ``except SoftTimeLimitExceeded`` never saw it). Real signals (``pthread_kill``) to the main thread.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

import lockkit
from lockkit.testing import hold_lock, in_thread, wait_until_blocked
from lockkit_tests.models import Stock

ALIAS = "mariadb"
JOIN = 30.0

pytestmark = [
    pytest.mark.skipif(
        ALIAS not in settings.DATABASES, reason="no MariaDB/MySQL configured: set LOCKKIT_TEST_MYSQL_URL"
    ),
    pytest.mark.skipif(
        threading.current_thread() is not threading.main_thread(), reason="signals need the main thread"
    ),
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS]),
]


class TimeLimitExceeded(Exception):
    """What a task runner's signal handler raises (Celery's SoftTimeLimitExceeded is an Exception too)."""


def _raise_time_limit(signum: int, frame: Any) -> None:
    raise TimeLimitExceeded("soft time limit")


@pytest.fixture
def time_limit() -> Iterator[None]:
    previous = signal.signal(signal.SIGUSR1, _raise_time_limit)
    yield
    signal.signal(signal.SIGUSR1, previous)


def _session_values() -> tuple[int, int]:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT @@SESSION.lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_time_limit_raised_into_a_row_lock_wait_is_raised_as_itself_and_nothing_commits(
    time_limit: None,
) -> None:
    stock = Stock.objects.using(ALIAS).create(sku="widget", available=5)
    before = _session_values()
    main = threading.main_thread().ident
    assert main is not None
    with hold_lock(stock, using=ALIAS) as holder:

        def signal_then_release() -> None:
            wait_until_blocked(holder.pid, timeout=JOIN, using=ALIAS)
            signal.pthread_kill(main, signal.SIGUSR1)  # pending until mysqlclient's wait returns...
            holder.release()  # ...which it does now: the row is granted, the handler runs before it is read

        sender = in_thread(signal_then_release)
        with pytest.raises(TimeLimitExceeded), lockkit.locked(ALIAS, lock_timeout=20) as scope:
            row = scope.get(Stock, pk="widget")
            row.available -= 1
            row.save(using=ALIAS)
        sender.result(JOIN)
    assert Stock.objects.using(ALIAS).get().available == 5  # the interrupted update never happened
    with hold_lock(stock, using=ALIAS, nowait=True):  # nobody holds the row
        pass
    assert _session_values() == before  # the scope's lock waits did not stay on the session
    with lockkit.locked(ALIAS) as scope:  # the next call in the same process works
        assert scope.get(Stock, pk="widget").available == 5
