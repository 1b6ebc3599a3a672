"""A pooled connection left on a node that became read-only is discarded, so the next call reaches the writer.

Issue 33, item 2: after a DNS-based or Aurora/RDS failover, a connection Django keeps open stays on the old writer,
now read-only; every later call failed with ``ReadOnlyDatabase`` and a worker never recovered, though a new
connection would have reached the writer. Two throwaway clusters this test starts, reached through one multi-host
alias (``HOST="127.0.0.1,127.0.0.1"``, ``target_session_attrs=read-write``): the alias connects to the first; the
first is then made read-only (``ALTER SYSTEM SET default_transaction_read_only = on`` and a reload, which the open
session takes up too), so that only a new connection reaches the second. Each entry point either recovers within
its retry (nothing was written on the read-only node) or fails once; the next call works and writes on the second.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections
from django.db.models import F

import lockkit
from lockkit.claims import claim_next
from lockkit_harness.cluster import TempCluster, missing_binaries
from lockkit_tests.models import Job, Stock
from lockkit_tests.support.faultkit import create_tables, extra_alias

MISSING = missing_binaries()
ALIAS = "restartable"
TIMEOUT = 30.0

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=f"no throwaway clusters: {MISSING}"),
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS]),
]


def _port() -> int:
    """A free TCP port on 127.0.0.1 in 48000-48999."""
    for port in range(48000, 49000):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 48000-48999")


def _sql(port: int, sql: str, params: Any = None) -> Any:
    with psycopg.connect(
        f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True
    ) as conn:
        cursor = conn.execute(sql, params)
        row = cursor.fetchone() if cursor.description else None
    return None if row is None else row[0]


def _alias_sql(sql: str) -> Any:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(sql)
        row = cursor.fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def nodes() -> Iterator[tuple[TempCluster, TempCluster]]:
    with TempCluster(prefix="lockkit-ro-old-", port=_port()) as old:
        with TempCluster(prefix="lockkit-ro-new-", port=_port()) as new:
            for node in (old, new):
                with extra_alias(ALIAS, "default", HOST="127.0.0.1", PORT=str(node.port), NAME="postgres"):
                    create_tables(ALIAS, Stock, Job)
                    Stock.objects.using(ALIAS).create(sku="widget", available=10)
                    Job.objects.using(ALIAS).bulk_create([Job(name=f"j{n}") for n in range(4)])
            hosts = {"HOST": "127.0.0.1,127.0.0.1", "PORT": f"{old.port},{new.port}", "NAME": "postgres"}
            options = {"sslmode": "disable", "target_session_attrs": "read-write", "connect_timeout": 2}
            with extra_alias(ALIAS, "default", OPTIONS=options, **hosts):
                yield old, new


def _on_old_node_turned_read_only(old: TempCluster) -> None:
    """Leave the alias's connection open on ``old``, then make ``old`` read-only under it (a failover)."""
    _sql(old.port, "ALTER SYSTEM RESET default_transaction_read_only")
    _sql(old.port, "SELECT pg_reload_conf()")
    connections[ALIAS].close()
    deadline = time.monotonic() + TIMEOUT
    while _alias_sql("SELECT inet_server_port()") != old.port:  # reconnects to the first host once writable
        assert time.monotonic() < deadline, "the alias did not reconnect to the first node"
        connections[ALIAS].close()
        time.sleep(0.05)
    _sql(old.port, "ALTER SYSTEM SET default_transaction_read_only = on")
    _sql(old.port, "SELECT pg_reload_conf()")
    deadline = time.monotonic() + TIMEOUT
    while _alias_sql("SHOW default_transaction_read_only") != "on":  # the open session has taken it up
        assert time.monotonic() < deadline, "the open session did not become read-only"
        time.sleep(0.02)


def _reserve_in_scope() -> int:
    with lockkit.locked(ALIAS) as scope:
        row = scope.get(Stock, pk="widget")
        row.available -= 1
        row.save(using=ALIAS)
        return scope.attempt


@lockkit.locked_operation(ALIAS)
def _reserve() -> int:
    scope = lockkit.current_scope()
    row = scope.get(Stock, pk="widget")
    row.available -= 1
    row.save(using=ALIAS)
    return scope.attempt


def _claim() -> int:
    return len(claim_next(Job.objects.using(ALIAS), worker="w", lease=60))


def _guarded() -> int:
    return len(
        lockkit.guarded_update(
            Stock.objects.using(ALIAS).filter(available__gt=0), available=F("available") - 1
        )
    )


def _locked_update() -> int:
    row = lockkit.locked_update(
        Stock.objects.using(ALIAS).filter(pk="widget"), lambda s: {"available": s.available - 1}
    )
    return 1 if row is not None else 0


# (entry point, whether its retry policy recovers within the call: nothing was written on the read-only node)
CALLS: list[tuple[str, Callable[[], int], bool]] = [
    ("scope", _reserve_in_scope, False),  # with locked(): no retries
    ("locked_operation", _reserve, True),
    ("claim_next", _claim, True),
    ("guarded_update", _guarded, True),
    ("locked_update", _locked_update, True),
]


def _written(port: int) -> tuple[int, int]:
    """(units taken, jobs claimed) on the node at ``port``."""
    return (
        10 - int(_sql(port, "SELECT available FROM lockkit_tests_stock WHERE sku = 'widget'")),
        int(_sql(port, "SELECT count(*) FROM lockkit_tests_job WHERE claim_token > 0")),
    )


@pytest.mark.parametrize(("call", "recovers"), [(c[1], c[2]) for c in CALLS], ids=[c[0] for c in CALLS])
def test_a_connection_on_a_node_that_became_read_only_is_discarded(
    nodes: tuple[TempCluster, TempCluster], call: Callable[[], int], recovers: bool
) -> None:
    old, new = nodes
    _on_old_node_turned_read_only(old)
    if recovers:
        assert call() >= 1  # the retry reconnected, to the writer
    else:
        with pytest.raises(lockkit.ReadOnlyDatabase):
            call()
    assert call() >= 1  # the next call works...
    assert _alias_sql("SELECT inet_server_port()") == new.port  # ...on the writer
    expected = 2 if recovers else 1
    taken = _written(new.port)
    assert taken[0] + taken[1] == expected  # and it wrote there, once per successful call
    assert _written(old.port) == (0, 0)  # nothing on the read-only node
