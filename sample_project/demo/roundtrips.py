"""Why the sale's throughputs differ, measured: round trips per reservation and how many of them hold the row lock.

After the sale, each implementation makes ``COUNT`` uncontended reservations on a probe row in the parent process,
timed (wall clock and this process's CPU), then ``COUNT`` more while libpq traces the connection (psycopg's public ``PGconn.trace()``). Every request ends with the server's
``ReadyForQuery``, so those are the round trips; the row lock is held from the request that first writes or locks
the stock row (``UPDATE``/``FOR UPDATE`` on ``inventory_stock``) through the one after which the server is idle
again (``ReadyForQuery I``: the transaction ended). Under contention a hot SKU's row serialises its reservations,
so the round trips spent holding it bound the throughput.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

COUNT = 50
PROBE_SKU = "demo-roundtrip-probe"
# A request that takes the stock row's lock: a locking read or a write of the row (Django quotes the table name).
_LOCKING = re.compile(r'(FOR (NO KEY )?UPDATE|UPDATE\s+"?inventory_stock"?)', re.IGNORECASE)


@dataclass(frozen=True)
class RoundTrips:
    """One implementation's cost per uncontended reservation."""

    per_call: float
    lock_held: float
    ms_per_call: float
    #: This process's CPU time per reservation: what bounds throughput when the workers outnumber the cores.
    cpu_ms_per_call: float


def measure(reserve: Callable[[str, int], int], count: int = COUNT) -> RoundTrips | None:
    """Round trips of ``count`` reservations by ``reserve`` on a probe row; ``None`` if libpq cannot trace here.

    Creates the probe row (and its reservations) and deletes them afterwards.
    """
    from django.db import connections, router
    from psycopg import pq

    from sample_project.inventory.models import Reservation, Stock

    alias = router.db_for_write(Stock)
    connection = connections[alias]
    Stock.objects.using(alias).update_or_create(sku=PROBE_SKU, defaults={"available": 2 * count + 3})
    try:
        for _ in range(3):  # the connection, prepared state and caches warm
            reserve(PROBE_SKU, 1)
        # Timed without the trace, whose writes would cost every implementation client time.
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(count):
            reserve(PROBE_SKU, 1)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        connection.ensure_connection()
        pgconn = getattr(connection.connection, "pgconn", None)  # a psycopg 3 connection's libpq handle
        if pgconn is None:
            return None
        with tempfile.TemporaryFile("w+") as trace:
            try:
                pgconn.trace(trace.fileno())
                pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            except Exception:  # libpq built without tracing, or another pq implementation
                return None
            try:
                for _ in range(count):
                    reserve(PROBE_SKU, 1)
            finally:
                pgconn.untrace()  # flushes libpq's buffer into the file
            trace.seek(0)
            trips, held = count_round_trips(trace.read())
    finally:
        Reservation.objects.using(alias).filter(stock_id=PROBE_SKU).delete()
        Stock.objects.using(alias).filter(sku=PROBE_SKU).delete()
    return RoundTrips(
        per_call=trips / count,
        lock_held=held / count,
        ms_per_call=1000 * seconds / count,
        cpu_ms_per_call=1000 * cpu / count,
    )


def count_round_trips(trace: str) -> tuple[int, int]:
    """Round trips in a libpq trace, and how many of them ran while the stock row was locked."""
    trips = held = 0
    locked_at: int | None = None
    for line in trace.splitlines():
        # PQtrace lines (timestamps suppressed): direction (F frontend, B backend), length, message type, contents.
        fields = line.split("\t")
        if len(fields) < 3:
            continue
        side, message = fields[0], fields[2]
        if side == "F" and locked_at is None and _LOCKING.search(line):
            locked_at = trips
        elif side == "B" and message.startswith("ReadyForQuery"):
            trips += 1
            if locked_at is not None and line.rstrip().endswith("I"):
                held += trips - locked_at
                locked_at = None
    return trips, held
