"""What a refused advisory lock says: the key, and the server session holding it, on PostgreSQL and MariaDB.

The holder's pid is the one ``lockkit.testing.backend_pid`` reports in the holder's thread: asked on the same
connection, at once when the refusal is no error (``GET_LOCK`` returning 0, ``pg_try_advisory_*`` false), and after
the scope's rollback for PostgreSQL's expired ``lock_timeout`` (an error that aborts the transaction).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import DatabaseError, connections, transaction

import lockkit
from lockkit import LockNotAvailable, LockTimeout, RetryPolicy, locked, locked_operation
from lockkit.advisory.keys import advisory_key
from lockkit.backends import backend_for
from lockkit.testing import backend_pid, in_thread
from lockkit_tests.models import Item
from lockkit_tests.support.vendors import vendor_params

pytestmark = pytest.mark.contention
BOTH = vendor_params()
POSTGRESQL = [param for param in vendor_params() if param.id == "postgresql"]


@contextmanager
def held_elsewhere(alias: str, key: Any, *, shared: bool = False, session: bool = False) -> Iterator[int]:
    """Hold ``key`` from another thread's session until the block exits; yield that session's pid."""
    taken, done = threading.Event(), threading.Event()
    pid: dict[str, int] = {}

    def hold() -> None:
        with lockkit.advisory_lock(key, using=alias, shared=shared, session=session, lock_timeout=10):
            pid["pid"] = backend_pid(alias)
            taken.set()
            assert done.wait(30), "the test never released the holder"

    call = in_thread(hold)
    if not taken.wait(30):
        call.result(timeout=5)
        pytest.fail("the holder did not take the lock within 30s")
    try:
        yield pid["pid"]
    finally:
        done.set()
        call.result(timeout=30)


def not_available(alias: str, key: Any, held_by: str) -> str:
    return f"lock_not_available on database {alias!r}: advisory lock {advisory_key(key)} is held by {held_by}"


def timed_out(alias: str, key: Any, seconds: str, held_by: str) -> str:
    return (
        f"lock_timeout on database {alias!r}: advisory lock {advisory_key(key)} was not granted within "
        f"{seconds}: it is held by {held_by}"
    )


@pytest.mark.parametrize("alias", BOTH)
@pytest.mark.parametrize(
    "key", ["cron-x", 42, ("billing", 7), "ключ\x1b[2J\n"], ids=["str", "int", "pair", "control-characters"]
)
def test_nowait_names_the_key_and_the_holder(alias: str, key: Any) -> None:
    with held_elsewhere(alias, key) as holder:
        with pytest.raises(LockNotAvailable) as standalone:
            with lockkit.advisory_lock(key, using=alias, nowait=True):
                pytest.fail("the block must not run")
        with pytest.raises(LockNotAvailable) as session:
            with lockkit.advisory_lock(key, using=alias, nowait=True, session=True):
                pytest.fail("the block must not run")
        with pytest.raises(LockNotAvailable) as in_scope, locked(alias, nowait=True) as scope:
            scope.advisory_lock(key)
    expected = not_available(alias, key, f"session {holder}")
    assert [str(standalone.value), str(session.value), str(in_scope.value)] == [expected] * 3
    assert "'cron-x' (hashed to " in expected or key != "cron-x"
    # The key is shown by repr(): a control character in it cannot reach a terminal or a log line raw.
    assert "\x1b" not in expected
    assert "\n" not in expected


@pytest.mark.parametrize("alias", BOTH)
@pytest.mark.parametrize("key", ["cron-x", -(2**63), (-1, 2**31 - 1)], ids=["str", "int", "pair"])
def test_a_timeout_names_the_key_and_the_holder(alias: str, key: Any) -> None:
    with held_elsewhere(alias, key, session=True) as holder:
        with pytest.raises(LockTimeout) as standalone:
            with lockkit.advisory_lock(key, using=alias, lock_timeout=0.2):
                pytest.fail("the block must not run")
        with pytest.raises(LockTimeout) as session:
            with lockkit.advisory_lock(key, using=alias, lock_timeout=0.2, session=True):
                pytest.fail("the block must not run")
        with pytest.raises(LockTimeout) as in_scope, locked(alias, lock_timeout=0.25) as scope:
            scope.advisory_lock(key)
        # The connection is usable afterwards, outside any transaction.
        assert not connections[alias].in_atomic_block
        assert Item.objects.using(alias).count() == 0
    assert [str(standalone.value), str(session.value), str(in_scope.value)] == [
        timed_out(alias, key, "0.2s", f"session {holder}"),
        timed_out(alias, key, "0.2s", f"session {holder}"),
        timed_out(alias, key, "0.25s", f"session {holder}"),
    ]
    assert standalone.value.sqlstate == ("55P03" if alias == "default" else None)
    assert standalone.value.alias == alias


@pytest.mark.parametrize("alias", BOTH)
def test_a_nested_scope_names_the_holder_and_the_outer_transaction_carries_on(alias: str) -> None:
    with held_elsewhere(alias, "cron-x") as holder, locked(alias, lock_timeout=5) as outer:
        Item.objects.using(alias).create(name="before")
        with pytest.raises(LockTimeout) as caught, locked(alias, lock_timeout=0.2) as inner:
            inner.advisory_lock("cron-x")
        assert str(caught.value) == timed_out(alias, "cron-x", "0.2s", f"session {holder}")
        Item.objects.using(alias).create(name="after")  # the outer transaction is intact
        assert outer.alias == alias
    assert sorted(Item.objects.using(alias).values_list("name", flat=True)) == ["after", "before"]


@pytest.mark.parametrize("alias", BOTH)
def test_a_swallowed_timeout_raised_at_the_scope_end_names_the_holder(alias: str) -> None:
    swallowed: list[LockTimeout] = []
    with held_elsewhere(alias, "cron-x") as holder:
        with pytest.raises(LockTimeout) as caught, locked(alias, lock_timeout=0.2) as scope:
            try:
                scope.advisory_lock("cron-x")
            except LockTimeout as error:
                swallowed.append(error)
    assert caught.value is swallowed[0]
    assert str(caught.value) == timed_out(alias, "cron-x", "0.2s", f"session {holder}")


@pytest.mark.parametrize("alias", BOTH)
def test_the_last_retried_attempt_names_the_holder(alias: str) -> None:
    @locked_operation(using=alias, lock_timeout=0.1, retry=RetryPolicy(attempts=2, wait_initial=0.01))
    def nightly() -> None:
        lockkit.current_scope().advisory_lock("nightly")

    with held_elsewhere(alias, "nightly") as holder, pytest.raises(LockTimeout) as caught:
        nightly()
    assert caught.value.attempts == 2
    assert str(caught.value) == timed_out(alias, "nightly", "0.1s", f"session {holder}")


@pytest.mark.parametrize("alias", POSTGRESQL)
def test_shared_holders_are_all_named_and_only_exclusive_ones_block_a_shared_request(alias: str) -> None:
    with (
        held_elsewhere(alias, "report", shared=True) as first,
        held_elsewhere(alias, "report", shared=True) as second,
    ):
        with pytest.raises(LockNotAvailable) as caught:
            with lockkit.advisory_lock("report", using=alias, nowait=True):
                pytest.fail("the block must not run")
        with lockkit.advisory_lock("report", using=alias, nowait=True, shared=True):
            pass  # shared holders let a shared request in
    low, high = sorted((first, second))
    assert str(caught.value) == not_available(alias, "report", f"sessions {low}, {high}")
    with held_elsewhere(alias, "report") as exclusive:
        with pytest.raises(LockTimeout) as timed:
            with lockkit.advisory_lock("report", using=alias, lock_timeout=0.2, shared=True):
                pytest.fail("the block must not run")
    assert str(timed.value) == timed_out(alias, "report", "0.2s", f"session {exclusive}")


@pytest.mark.parametrize("alias", BOTH)
def test_the_backend_names_other_holders_only(alias: str) -> None:
    connection = connections[alias]
    backend = backend_for(connection)
    key = advisory_key("cron-x")
    backend_pid(alias)  # open this thread's connection: a closed one is not asked (None)
    assert backend.locks.advisory_holders(connection, key, shared=False) == ()
    with lockkit.advisory_lock("cron-x", using=alias):  # this session's own hold is not "another session"
        assert backend.locks.advisory_holders(connection, key, shared=False) == ()
    with held_elsewhere(alias, "cron-x") as holder:
        assert backend.locks.advisory_holders(connection, key, shared=False) == (holder,)
        assert backend.locks.advisory_holders(connection, advisory_key("other"), shared=False) == ()


@pytest.mark.parametrize("alias", POSTGRESQL)
def test_no_holder_lookup_in_a_failed_transaction(alias: str) -> None:
    connection = connections[alias]
    backend = backend_for(connection)
    with held_elsewhere(alias, (3, 4)) as holder, transaction.atomic(using=alias):
        assert backend.locks.advisory_holders(connection, advisory_key((3, 4)), shared=False) == (holder,)
        with pytest.raises(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        # The transaction has failed: asking would be refused (25P02); lockkit does not ask.
        assert backend.locks.advisory_holders(connection, advisory_key((3, 4)), shared=False) is None
        transaction.set_rollback(True, using=alias)
