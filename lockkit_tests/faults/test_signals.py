"""An exception raised into a lock wait by a signal handler (issue 23, items 8 and 10).

Task runners enforce time limits with signals (Celery's soft time limit, RQ, ``SIGALRM`` handlers): the handler
raises in the main thread while psycopg waits for the reply, and the server goes on waiting and then holds the lock.
lockkit cancels the statement on the server and drops the connection; a session-level advisory lock interrupted
while being taken never outlives the block. Real signals (``pthread_kill``) to the main thread, which runs the test.
"""

from __future__ import annotations

import signal
import threading
import time
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
    pytest.mark.usefixtures("ctrl_c_live"),
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


# A deferred constraint trigger runs at COMMIT: its pg_sleep holds the COMMIT in flight (as a synchronous standby
# that stops answering would), long enough for a time limit to fire while the client waits for the reply.
_SLOW_COMMIT = """
CREATE TABLE lockkit_slow_commit (id int);
CREATE FUNCTION lockkit_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(20);
    RETURN NULL;
EXCEPTION WHEN query_canceled THEN
    IF NEW.id = 2 THEN RETURN NULL; END IF;  -- row 2: the trigger survives the cancel and the COMMIT goes on
    RAISE;
END $$;
CREATE CONSTRAINT TRIGGER lockkit_slow_commit AFTER INSERT ON lockkit_slow_commit
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION lockkit_slow_commit();
"""


@pytest.fixture
def slow_commit() -> Iterator[None]:
    with connections["default"].cursor() as cursor:
        cursor.execute(_SLOW_COMMIT)
    yield
    with connections["default"].cursor() as cursor:
        cursor.execute("DROP TABLE lockkit_slow_commit; DROP FUNCTION lockkit_slow_commit()")


def _signal_main_during_commit(session: int, signum: int) -> ThreadCall[None]:
    """Send ``signum`` to the main thread once session ``session`` runs its COMMIT (seen in pg_stat_activity)."""
    main = threading.main_thread().ident
    assert main is not None

    def send() -> None:
        control = connections.create_connection("default")
        try:
            deadline = time.monotonic() + JOIN
            while True:
                with control.cursor() as cursor:
                    cursor.execute("SELECT query, wait_event FROM pg_stat_activity WHERE pid = %s", [session])
                    row = cursor.fetchone()
                if row is not None and row[0].strip().upper() == "COMMIT" and row[1] == "PgSleep":
                    break
                assert time.monotonic() < deadline, "the COMMIT never ran its deferred trigger"
                time.sleep(0.02)
            signal.pthread_kill(main, signum)
        finally:
            control.close()

    return in_thread(send)


@pytest.mark.parametrize("committed", [False, True], ids=["cancel-stops-it", "commits-anyway"])
def test_a_time_limit_raised_while_commit_is_in_flight_tells_the_outcome_and_the_next_call_works(
    time_limit: None, slow_commit: None, committed: bool
) -> None:
    """Not a database error leaving the COMMIT: the server may still commit. Before, the caller got Django's
    "can't change 'autocommit' now" (a failure) for work that went on to commit, its callbacks never ran, and the
    next call failed with "another command is already in progress"."""
    session = backend_pid()
    sender = _signal_main_during_commit(session, signal.SIGUSR1)
    callbacks: list[str] = []
    with pytest.raises(TimeLimitExceeded) as caught, lockkit.locked() as scope:
        Stock.objects.create(sku="widget", available=5)
        with connections["default"].cursor() as cursor:
            cursor.execute("INSERT INTO lockkit_slow_commit VALUES (%s)", [2 if committed else 1])
        scope.on_commit(lambda: callbacks.append("sent"))
    sender.result(JOIN)
    notes = getattr(caught.value, "__notes__", [])
    wait_until_gone("default", session)  # the interrupted connection was discarded: its transaction has ended
    # What the server did, read once the session is gone: lockkit's answer must match it, whichever it was.
    on_server = list(Stock.objects.values_list("available", flat=True))
    if not committed:
        assert on_server == []  # the cancel stopped the COMMIT's trigger: rolled back
    if on_server:
        assert on_server == [5]
        assert any("committed before this interrupted its COMMIT" in note for note in notes), notes
        assert callbacks == ["sent"]
    else:
        # Row 2's trigger survives the cancel, so the server nearly always commits it; once, on a loaded machine
        # (CI, embedded PostgreSQL 16), it rolled it back instead, and lockkit must then say that nothing committed.
        assert notes == [], notes
        assert callbacks == []
    with lockkit.locked() as scope:  # the next call in the same process works
        assert scope.lock(Stock).count() == len(on_server)
