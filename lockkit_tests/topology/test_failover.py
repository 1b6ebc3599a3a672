"""A lost COMMIT is resolved only by the server that had the transaction (issue 23, item 1).

A primary and a hot standby this test starts, reached through a multi-host DSN
(``HOST="127.0.0.1,127.0.0.1"``, ``target_session_attrs=read-write``), each behind a ``FaultProxy``. The standby
stops streaming (asynchronous replication falls behind), a reservation's COMMIT is held by the proxy and its reply
cut, the primary crashes, the standby is promoted (a new timeline) and hands out the lost transaction's id again to
a transaction of its own. Asking the promoted standby ``pg_xact_status`` about that id says "committed": a phantom
commit. lockkit checks the server's identity (system identifier and timeline) first and says
``CommitOutcomeUnknown``; the next call works on the new primary.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections

import lockkit
from lockkit import RetryPolicy
from lockkit.testing import in_thread
from lockkit_harness.cluster import TempCluster, missing_binaries
from lockkit_harness.proxy import FaultProxy
from lockkit_tests.models import Stock
from lockkit_tests.support.faultkit import create_tables, extra_alias

MISSING = missing_binaries(standby=True)
ALIAS = "restartable"
JOIN = 60.0

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=f"no throwaway primary and standby: {MISSING}"),
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS]),
]


def _sql(port: int, sql: str, params: Any = None) -> Any:
    with psycopg.connect(
        f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True
    ) as conn:
        cursor = conn.execute(sql, params)
        row = cursor.fetchone() if cursor.description else None
    return None if row is None else row[0]


def _until(condition: Any, what: str, timeout: float = JOIN) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def cluster() -> Iterator[tuple[TempCluster, TempCluster, FaultProxy, FaultProxy]]:
    with TempCluster(prefix="lockkit-ha-primary-") as primary:
        standby = TempCluster(prefix="lockkit-ha-standby-", standby_of=primary)
        try:
            standby.start()
            with (
                FaultProxy(("127.0.0.1", primary.port), "postgresql") as to_primary,
                FaultProxy(("127.0.0.1", standby.port), "postgresql") as to_standby,
            ):
                yield primary, standby, to_primary, to_standby
        finally:
            standby.remove()


def test_a_lost_commit_is_not_resolved_by_a_promoted_standby(
    cluster: tuple[TempCluster, TempCluster, FaultProxy, FaultProxy],
) -> None:
    primary, standby, to_primary, to_standby = cluster
    hosts = {
        "HOST": "127.0.0.1,127.0.0.1",
        "PORT": f"{to_primary.port},{to_standby.port}",
        "NAME": "postgres",
    }
    options = {"sslmode": "disable", "target_session_attrs": "read-write", "connect_timeout": 2}
    with extra_alias(ALIAS, "default", OPTIONS=options, **hosts):
        create_tables(ALIAS, Stock)
        Stock.objects.using(ALIAS).create(sku="widget", available=10)
        lsn = _sql(primary.port, "SELECT pg_current_wal_lsn()::text")
        replayed = "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn"
        _until(lambda: _sql(standby.port, replayed, [lsn]), "the standby to replay the primary")
        # Asynchronous replication falls behind: the standby stops streaming before the reservation.
        _sql(standby.port, "ALTER SYSTEM SET primary_conninfo = ''")
        _sql(standby.port, "SELECT pg_reload_conf()")
        _until(
            lambda: _sql(standby.port, "SELECT count(*) FROM pg_stat_wal_receiver") == 0, "streaming to stop"
        )
        to_standby.refuse_new = True  # the standby is not reachable while the failover happens

        @lockkit.locked_operation(ALIAS, retry=RetryPolicy(reconnect_within=JOIN))
        def reserve() -> int:
            row = lockkit.current_scope().get(Stock, pk="widget")
            row.available -= 1
            row.save(using=ALIAS)
            to_primary.arm("hold")  # the COMMIT is never forwarded, and its reply never comes
            return row.available

        call = in_thread(reserve)
        _until(lambda: to_primary.cuts["hold"] == 1, "the COMMIT to be held")
        xid = int(_sql(primary.port, "SELECT max(backend_xid::text::bigint) FROM pg_stat_activity"))
        primary.stop("immediate")  # the primary crashes: the held transaction never commits
        standby.promote()
        # The new primary hands the lost transaction's id out again, to a transaction that commits.
        _until(lambda: int(_sql(standby.port, "SELECT txid_current()")) >= xid, "the id to be reused", 30)
        assert _sql(standby.port, "SELECT pg_xact_status(%s::text::xid8)", [str(xid)]) == "committed"
        to_standby.refuse_new = False  # lockkit's resolution now reaches the promoted standby
        with pytest.raises(lockkit.CommitOutcomeUnknown) as caught:
            call.result(JOIN)
        assert caught.value.xid == xid
        connections[ALIAS].close()  # this thread's own connection still points at the crashed primary
        assert (
            Stock.objects.using(ALIAS).get().available == 10
        )  # the reservation does not exist: never "done"
        with lockkit.locked(ALIAS) as scope:  # the next call works, on the new primary
            row = scope.get(Stock, pk="widget")
            row.available -= 1
            row.save(using=ALIAS)
        assert Stock.objects.using(ALIAS).get().available == 9
        connections[ALIAS].close()
