"""The latency relay the benchmarks run through (``--rtt``): it adds at least the round trip asked, and forwards the
protocol faithfully, including a session the server ends."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connections

from lockkit_harness.latency import LatencyRelay, measure_rtt

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

RTT = 0.002  # seconds: far above loopback's own round trip, so the lower bound below is the relay's


def _conninfo(port: int) -> str:
    settings = connections["default"].settings_dict
    return psycopg.conninfo.make_conninfo(
        host="127.0.0.1",
        port=port,
        user=settings["USER"],
        dbname=settings["NAME"],
        password=settings["PASSWORD"],
    )


def _server() -> tuple[str, int]:
    settings = connections["default"].settings_dict
    return str(settings["HOST"] or "127.0.0.1"), int(settings["PORT"] or 5432)


def test_every_round_trip_through_the_relay_takes_at_least_the_delay_asked() -> None:
    with LatencyRelay(*_server(), rtt=RTT) as relay:
        figures = measure_rtt(_conninfo(relay.port), count=50)
    # The relay sleeps until each chunk is due (an absolute clock), so no round trip can be shorter.
    assert figures["min_ms"] >= RTT * 1000


def test_the_relay_forwards_results_and_a_terminated_session_then_a_new_one() -> None:
    with LatencyRelay(*_server(), rtt=0.0005) as relay:
        with psycopg.connect(_conninfo(relay.port), autocommit=True) as first:
            pid = first.info.backend_pid
            rows = first.execute("SELECT g, repeat('x', 100000) FROM generate_series(1, 20) AS g").fetchall()
            assert [r[0] for r in rows] == list(range(1, 21))
            assert all(len(r[1]) == 100000 for r in rows)
            with psycopg.connect(_conninfo(relay.port), autocommit=True) as killer:
                assert killer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
            with pytest.raises(psycopg.OperationalError):
                first.execute("SELECT 1")
        with psycopg.connect(_conninfo(relay.port), autocommit=True) as second:
            assert second.execute("SELECT 41 + 1").fetchone() == (42,)


def test_a_negative_round_trip_is_refused() -> None:
    with pytest.raises(ValueError, match="rtt"):
        LatencyRelay("127.0.0.1", 5432, rtt=-0.001)
