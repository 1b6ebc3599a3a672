"""django-pglock's ``test_advsiory_id``, ported onto lockkit, and the interop it implies: a key is one lock in both.

pglock hashes a ``str`` lock id to a bigint (the first 8 bytes of SHA-256, little-endian) and shows a lock as the
``(classid, objid)`` pair of ``pg_locks`` (``pglock.advisory_id``). lockkit's ``str`` keys hash the same way, so
during a migration from pglock, old and new processes exclude each other on the same key. Checked three ways: the
numbers (pglock's own function, and the documented recipe computed here independently), the pair PostgreSQL itself
shows for lockkit's lock, and real contention between ``pglock.advisory`` and ``lockkit.advisory_lock`` on two
sessions.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pglock
import pytest
from django.db import OperationalError, connections, transaction

import lockkit
from lockkit import LockNotAvailable, LockTimeout
from lockkit.advisory.keys import advisory_key, hash_text
from lockkit.testing import backend_pid, in_thread, wait_until_blocked

TEXTS = [
    "hello",
    "cron-x",
    "nightly-report",
    "pglock_port.tests.my_function",  # pglock's decorator default: "<module>.<function>"
    "ключ-🔒",
    "naïve café",
    " leading and trailing spaces ",
    "x" * 10_000,
    "\x00nul inside",
]


def documented_hash(text: str) -> int:
    """docs/advisory.md's recipe, written out here independently of both libraries."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little", signed=True)


def test_advsiory_id() -> None:
    """pglock's test, as it stands in its suite: the pair pglock says PostgreSQL shows for a key."""
    assert pglock.advisory_id(9223372036854775807) == (2147483647, 4294967295)
    assert pglock.advisory_id("hello") == (245608543, 3125670444)


@pytest.mark.parametrize("text", TEXTS, ids=lambda text: repr(text[:20]))
def test_a_str_key_hashes_as_pglock_hashes_it(text: str) -> None:
    value = advisory_key(text).value
    assert value == hash_text(text) == documented_hash(text)
    assert value == pglock.advisory(text).int_lock_id  # pglock's own cast of a lock id (a public property)
    assert pglock.advisory_id(text) == (value >> 32, value & 0xFFFFFFFF)


@pytest.mark.parametrize("key", [0, 1, -1, 2**63 - 1, -(2**63), 245608543 << 32])
def test_an_int_key_is_used_as_is_by_both(key: int) -> None:
    assert advisory_key(key).value == pglock.advisory(key).int_lock_id == key


def test_the_empty_string_is_refused_by_both() -> None:
    with pytest.raises(ValueError, match="key must not be an empty string"):
        advisory_key("")
    with pytest.raises(ValueError, match="Must supply a lock ID"):
        pglock.advisory("").acquire()


def test_a_hashed_pair_is_pglocks_lock_of_its_json_text() -> None:
    # pglock has no pairs; lockkit hashes a pair with a str in it as the compact JSON text of the pair.
    assert advisory_key(("billing", 42)).value == pglock.advisory('["billing",42]').int_lock_id
    assert advisory_key(("tenant-7", "ключ")).value == pglock.advisory('["tenant-7","ключ"]').int_lock_id


def _pairs_of_this_session() -> list[tuple[int, int, int]]:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks "
            "WHERE locktype = 'advisory' AND pid = pg_backend_pid() ORDER BY 1, 2"
        )
        return [tuple(row) for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_postgresql_shows_lockkits_lock_as_pglocks_advisory_id() -> None:
    """The port proper: the (classid, objid) pair pglock computes is the one pg_locks shows for lockkit's lock."""
    for key in ("hello", 9223372036854775807, "ключ-🔒", -5):
        classid, objid = pglock.advisory_id(key)
        with lockkit.advisory_lock(key, lock_timeout=5):
            # pg_locks shows classid as an oid (unsigned); pglock's pair keeps the sign of a negative bigint.
            assert _pairs_of_this_session() == [(classid & 0xFFFFFFFF, objid, 1)]
    with lockkit.advisory_lock("hello", session=True, lock_timeout=5):
        assert _pairs_of_this_session() == [(245608543, 3125670444, 1)]
    assert _pairs_of_this_session() == []


@contextmanager
def held_in_thread(take: Callable[[], AbstractContextManager[Any]]) -> Iterator[int]:
    """Hold the lock ``take()`` enters in another thread (its own session) until the block exits; yield its pid."""
    taken, done = threading.Event(), threading.Event()
    pid: dict[str, int] = {}

    def hold() -> None:
        with take() as result:
            assert result is not False, "the holder did not get the lock"
            pid["pid"] = backend_pid("default")
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


def _lockkit_free(key: str) -> bool:
    def attempt() -> bool:
        try:
            with lockkit.advisory_lock(key, nowait=True):
                return True
        except LockNotAvailable:
            return False

    return in_thread(attempt).result(timeout=30)


@pytest.mark.contention
@pytest.mark.django_db(transaction=True, databases=["default"])
@pytest.mark.parametrize("xact", [False, True], ids=["session", "xact"])
def test_pglock_holding_blocks_lockkit(xact: bool) -> None:
    def take() -> AbstractContextManager[Any]:
        if not xact:
            return pglock.advisory("cron-x")  # pg_advisory_lock, released at the block's end
        return _pglock_xact("cron-x")

    with held_in_thread(take) as holder:
        with pytest.raises(LockNotAvailable) as caught:
            with lockkit.advisory_lock("cron-x", nowait=True):
                pytest.fail("lockkit took a key pglock holds")
        assert str(caught.value) == (
            f"lock_not_available on database 'default': advisory lock {advisory_key('cron-x')} is held by "
            f"session {holder}"
        )
        with pytest.raises(LockNotAvailable):
            with lockkit.advisory_lock("cron-x", nowait=True, session=True):
                pytest.fail("lockkit took a key pglock holds")
        with pytest.raises(LockTimeout, match=f"held by session {holder}"):
            with lockkit.advisory_lock("cron-x", lock_timeout=0.2):
                pytest.fail("lockkit took a key pglock holds")
        assert not connections["default"].in_atomic_block
    assert _lockkit_free("cron-x")


@contextmanager
def _pglock_xact(key: str) -> Iterator[bool]:
    with transaction.atomic():
        yield pglock.advisory(key, xact=True).acquire()  # pg_advisory_xact_lock


@pytest.mark.contention
@pytest.mark.django_db(transaction=True, databases=["default"])
@pytest.mark.parametrize("session", [False, True], ids=["scope", "session"])
def test_lockkit_holding_blocks_pglock(session: bool) -> None:
    with held_in_thread(lambda: lockkit.advisory_lock("cron-x", session=session, lock_timeout=10)):
        assert pglock.advisory("cron-x", timeout=0).acquire() is False  # pg_try_advisory_lock
        with pytest.raises(OperationalError, match='Could not acquire lock "cron-x"'):
            pglock.advisory("cron-x", timeout=0, side_effect=pglock.Raise).acquire()
        with transaction.atomic():
            assert pglock.advisory("cron-x", xact=True, timeout=0).acquire() is False
    with pglock.advisory("cron-x", timeout=0) as acquired:
        assert acquired is True


@pytest.mark.contention
@pytest.mark.django_db(transaction=True, databases=["default"])
def test_pglock_waits_for_lockkit_then_gets_the_lock() -> None:
    def pglock_waits() -> bool:
        # A finite timeout: pglock sets lock_timeout (session-level) around pg_advisory_lock.
        with pglock.advisory("cron-x", timeout=20) as acquired:
            return bool(acquired)

    with held_in_thread(lambda: lockkit.advisory_lock("cron-x", lock_timeout=10)) as holder:
        contender = in_thread(pglock_waits)
        assert wait_until_blocked(holder, contenders=contender)
        assert not contender.done()
    assert contender.result(timeout=30) is True


@pytest.mark.contention
@pytest.mark.django_db(transaction=True, databases=["default"])
def test_lockkit_waits_for_pglock_then_gets_the_lock() -> None:
    def lockkit_waits() -> int:
        with lockkit.advisory_lock("cron-x", lock_timeout=20) as held:
            assert held.pid is not None
            return held.pid

    with held_in_thread(lambda: pglock.advisory("cron-x")) as holder:
        contender = in_thread(lockkit_waits)
        assert wait_until_blocked(holder, contenders=contender)
        assert not contender.done()
    assert contender.result(timeout=30) != holder
