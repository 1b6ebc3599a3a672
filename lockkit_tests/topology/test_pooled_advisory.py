"""A session advisory lock through a real PgBouncer in transaction mode (issue 33, item 1).

PgBouncer hands each transaction the server session released last: a second client asking for the key gets the
very server session that holds it, where PostgreSQL's advisory locks are re-entrant, so it was granted and both
clients were inside at once, with no error at either exit. lockkit refuses it at entry
(``AdvisoryLockAlreadyHeld``), in the statement that would have taken the lock, and leaves no hold behind.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections

import lockkit
from lockkit.advisory.keys import advisory_key
from lockkit.testing import in_thread
from lockkit_tests.support.faultkit import behind_pgbouncer

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "bouncer"])
JOIN = 30.0
KEY = "cron:pooled"


@pytest.fixture(params=[1, 3], ids=["pool-size-1", "pool-size-3"])
def pooled(request: pytest.FixtureRequest) -> Iterator[str]:
    settings = {"default_pool_size": str(request.param), "reserve_pool_size": "0", "server_reset_query": ""}
    with behind_pgbouncer("default", settings) as alias:
        yield alias


def holders() -> list[int]:
    """The server sessions holding ``KEY``, asked directly (not through PgBouncer)."""
    unsigned = advisory_key(KEY).value & 0xFFFF_FFFF_FFFF_FFFF
    control = connections.create_connection("default")
    try:
        with control.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1 ORDER BY pid",
                [unsigned >> 32, unsigned & 0xFFFF_FFFF],
            )
            return [int(row[0]) for row in cursor.fetchall()]
    finally:
        control.close()


def enter(alias: str) -> int | None:
    """Another client of PgBouncer enters the same session lock; the server session it got, if it got in."""
    try:
        with lockkit.advisory_lock(KEY, using=alias, session=True, nowait=True) as held:
            return held.pid
    finally:
        connections.close_all()


def test_a_second_client_is_refused_the_server_session_that_holds_the_key(pooled: str) -> None:
    with lockkit.advisory_lock(KEY, using=pooled, session=True, nowait=True) as first:
        assert holders() == [first.pid]
        with pytest.raises(lockkit.AdvisoryLockAlreadyHeld) as caught:
            entered = in_thread(enter, pooled).result(JOIN)
            pytest.fail(f"a second client entered the session lock on server session {entered}")
        refused = caught.value
        assert isinstance(refused, lockkit.LockError)
        assert refused.alias == pooled
        assert f"server session {first.pid}" in str(refused)
        assert "pooler" in str(refused)
        assert holders() == [first.pid]
    # The refusal took no hold: the first client's one release frees the key.
    assert holders() == []
    assert in_thread(enter, pooled).result(JOIN) is not None  # and the next client gets it


def test_the_same_client_may_nest_the_same_session_lock(pooled: str) -> None:
    """Not a pooler's doing: this block already holds the key on this connection (PostgreSQL's re-entrancy)."""
    with lockkit.advisory_lock(KEY, using=pooled, session=True) as outer:
        with lockkit.advisory_lock(KEY, using=pooled, session=True) as inner:
            assert inner.pid == outer.pid
        assert holders() == [outer.pid]
    assert holders() == []
