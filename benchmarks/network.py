"""The network between the benchmark and the server: loopback, or loopback behind a latency relay (``--rtt MS``).

The relay (``lockkit_harness.latency``) is calibrated: a ``SELECT 1`` loop through it is timed, and while the
round trip it adds is more than 5 % off the one asked (the relay's own scheduling adds to its delay), it is restarted
with the error taken off its delay, a few times. The report prints the round trip measured both ways.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import quote

from benchmarks.dbserver import Target
from lockkit_harness.latency import LatencyRelay, measure_rtt

#: How far from the requested round trip a calibration may land before the relay's delay is corrected.
_TOLERANCE = 0.05
_ATTEMPTS = 4


def conninfo(target: Target) -> str:
    """A libpq connection string for ``target``."""
    parts = {"host": target.host, "port": target.port, "user": target.user, "dbname": target.dbname}
    if target.password:
        parts["password"] = target.password
    return " ".join(f"{k}='{v}'" for k, v in parts.items() if v)


def through_relay(target: Target, rtt_ms: float) -> tuple[Target, LatencyRelay, dict[str, Any]]:
    """Start a relay adding ``rtt_ms`` in front of ``target``; return the target through it, the relay, the figures.

    The relay's delay starts at ``rtt_ms`` and is corrected by what a ``SELECT 1`` loop measures (the relay's own
    scheduling adds to it), up to ``_ATTEMPTS`` times; the relay closest to ``rtt_ms`` is kept.
    """
    loopback = measure_rtt(conninfo(target))
    port = int(target.port or 5432)
    delay_ms, best = rtt_ms, None
    for _ in range(_ATTEMPTS):
        relay = LatencyRelay(target.host, port, delay_ms / 1000)
        relayed = _via(target, relay.port)
        measured = measure_rtt(conninfo(relayed))
        error = measured["median_ms"] - loopback["median_ms"] - rtt_ms
        if best is None or abs(error) < abs(best[0]):
            if best is not None:
                best[2].close()
            best = (error, delay_ms, relay, relayed, measured)
        else:
            relay.close()
        if abs(error) <= _TOLERANCE * rtt_ms:
            break
        delay_ms = max(delay_ms - error, 0.0)
    assert best is not None
    error, delay_ms, relay, relayed, measured = best
    figures = {
        "rtt_ms": rtt_ms,
        "relay_delay_ms": round(delay_ms, 4),
        "loopback": loopback,
        "measured": measured,
    }
    return relayed, relay, figures


def loopback(target: Target) -> dict[str, Any]:
    """The figures of a run without a relay."""
    return {
        "rtt_ms": 0.0,
        "relay_delay_ms": None,
        "loopback": measure_rtt(conninfo(target)),
        "measured": None,
    }


def _via(target: Target, port: int) -> Target:
    auth = quote(target.user, safe="") + (f":{quote(target.password, safe='')}" if target.password else "")
    url = f"postgres://{auth}@127.0.0.1:{port}/{quote(target.dbname, safe='')}"
    return dataclasses.replace(target, url=url, host="127.0.0.1", port=str(port))
