"""Ctrl-C racing the grant of an advisory lock that outlives its transaction (issue 33, item 4).

A ``KeyboardInterrupt`` that lands while the server grants a lock lockkit releases itself (``session=True``;
MariaDB's ``GET_LOCK`` in a scope too) must never leave that lock on the connection: inside a caller's ``atomic()``
as outside it, on PostgreSQL and MariaDB. Real SIGINT to the main thread, sent while the contender is queued behind
the holder (seen on the database), with the holder releasing at that moment: psycopg cancels on Ctrl-C, but the
release wins the race and the statement completes granted; mysqlclient runs the handler only once ``GET_LOCK`` has
returned. Afterwards another session checks that the key is free, and the next call in the process works.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import pytest
from django.db import connections, transaction
from django.dispatch import receiver

import lockkit
from lockkit.advisory.keys import advisory_key
from lockkit.signals import lock_acquired
from lockkit.testing import ThreadCall, backend_pid, in_thread, wait_until_blocked
from lockkit_tests.support.vendors import vendor_params

pytestmark = [
    pytest.mark.contention,
    pytest.mark.usefixtures("ctrl_c_live"),
    pytest.mark.skipif(
        threading.current_thread() is not threading.main_thread(), reason="signals need the main thread"
    ),
]
JOIN = 30.0
KEY = "interrupted-grant"


def _holder(alias: str, taken: threading.Event, release: threading.Event, pid: list[int]) -> None:
    with lockkit.advisory_lock(KEY, using=alias, session=True, lock_timeout=10):
        pid.append(backend_pid(alias))
        taken.set()
        assert release.wait(JOIN), "the test never released the holder"
    connections[alias].close()


def _interrupt_at_the_grant(alias: str, holder_pid: int, release: threading.Event) -> ThreadCall[None]:
    """Once this (main) thread's session waits behind the holder, send it SIGINT and let the holder go."""
    main = threading.main_thread().ident
    assert main is not None

    def send() -> None:
        try:
            wait_until_blocked(holder_pid, using=alias, timeout=JOIN, poll=0.15)
            signal.pthread_kill(main, signal.SIGINT)
        finally:
            release.set()
        connections.close_all()

    return in_thread(send)


def held_anywhere(alias: str) -> bool:
    """Whether any session holds ``KEY``, asked from a session of its own."""
    control = connections.create_connection(alias)
    key = advisory_key(KEY)
    try:
        with control.cursor() as cursor:
            if control.vendor == "postgresql":
                unsigned = key.value & 0xFFFF_FFFF_FFFF_FFFF
                cursor.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1",
                    [unsigned >> 32, unsigned & 0xFFFF_FFFF],
                )
                return int(cursor.fetchone()[0]) > 0
            cursor.execute("SELECT IS_USED_LOCK(%s)", [key.lock_name(str(control.settings_dict["NAME"]))])
            return cursor.fetchone()[0] is not None
    finally:
        control.close()


def free_within(alias: str, seconds: float = 10.0) -> bool:
    """Whether ``KEY`` is free within ``seconds`` (a dropped session's locks go when the server ends it)."""
    deadline = time.monotonic() + seconds
    while held_anywhere(alias):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("in_atomic", [False, True], ids=["autocommit", "in-atomic"])
@pytest.mark.parametrize("session", [False, True], ids=["scope", "session"])
@pytest.mark.parametrize("alias", vendor_params())
def test_ctrl_c_at_the_grant_leaves_no_lock_and_the_next_call_works(
    alias: str, session: bool, in_atomic: bool
) -> None:
    taken, release = threading.Event(), threading.Event()
    holder_pid: list[int] = []
    holder = in_thread(_holder, alias, taken, release, holder_pid)
    try:
        assert taken.wait(JOIN), "the holder did not take the key"
        sender = _interrupt_at_the_grant(alias, holder_pid[0], release)
        with pytest.raises(KeyboardInterrupt):
            with transaction.atomic(using=alias) if in_atomic else contextlib.nullcontext():
                with lockkit.advisory_lock(KEY, using=alias, session=session, lock_timeout=20):
                    # Granted, then interrupted inside the block: lockkit's exit releases it (a legal outcome).
                    time.sleep(JOIN)
        sender.result(JOIN)
    finally:
        release.set()
        holder.result(JOIN)
    assert free_within(alias), "the interrupted call left the key held"
    with lockkit.advisory_lock(KEY, using=alias, session=session, nowait=True) as held:  # the next call works
        assert held.pid == backend_pid(alias)


@pytest.mark.parametrize("in_atomic", [False, True], ids=["autocommit", "in-atomic"])
@pytest.mark.parametrize("alias", vendor_params())
def test_ctrl_c_once_the_grant_returned_leaves_no_lock_and_the_next_call_works(
    alias: str, in_atomic: bool
) -> None:
    """SIGINT delivered once the locking statement returned granted, before the scope recorded the lock: the
    ``lock_acquired`` signal is sent in that window, and its receiver raises SIGINT in this process (MariaDB's
    ``GET_LOCK`` is the session's: only lockkit's own release, or the session's end, frees it)."""

    @receiver(lock_acquired, weak=False)
    def interrupt(sender: object, alias: str, **kwargs: object) -> None:
        signal.raise_signal(signal.SIGINT)

    try:
        with pytest.raises(KeyboardInterrupt):
            with transaction.atomic(using=alias) if in_atomic else contextlib.nullcontext():
                with lockkit.advisory_lock(KEY, using=alias, lock_timeout=20):
                    pytest.fail("the block ran although the grant was interrupted")
    finally:
        lock_acquired.disconnect(interrupt)
    assert free_within(alias), "the interrupted call left the key held"
    with lockkit.advisory_lock(KEY, using=alias, nowait=True) as held:  # the next call works
        assert held.pid == backend_pid(alias)
