"""The physical floor beside each row: round trips x the measured round trip + the server's time for the same SQL.

A model, not a measurement: an operation of ``trips`` round trips cannot take less than ``trips x RTT + s``, where
RTT is the ``SELECT 1`` round trip measured for the run (pgbench's median at one client; through the relay with
``--rtt``) and ``s`` the server's time for the same SQL: pgbench's median time per transaction of that script at one
client, less its own round trips x RTT, the lowest over the rounds (bursts of load on a shared machine inflate it,
and a floor must stay below the truth). N processes cannot exceed N times that rate. On a hot row they cannot exceed
one transaction per lock hold either: ``1 / (held x RTT)``, ``held`` being the round trips from the locking
statement's reply to the COMMIT's (the server's time inside the hold left out, so it stays an upper bound), or
``1 / s`` for a single statement (``held == 0``), whose lock is taken and released inside one message.
"""

from __future__ import annotations

from typing import Any

from benchmarks.plan import WORKLOADS, Impl, Workload


def rtt_ms(data: dict[str, Any]) -> float | None:
    """The run's round trip in milliseconds: pgbench's ``SELECT 1`` at one client (its median), else psycopg's
    ``SELECT 1`` loop (through the relay when there was one), which also counts Python's time per call."""
    net = data.get("network")
    if not net:
        return None
    if net.get("pgbench_select1"):
        return float(net["pgbench_select1"]["p50_ms"])
    measured = net.get("measured") or net.get("loopback")
    return float(measured["median_ms"]) if measured else None


def server_ms(data: dict[str, Any]) -> dict[str, float]:
    """Per pgbench script: its one-client median time per transaction (lowest over rounds) less its round trips x
    RTT (ms, >= 0)."""
    rtt = rtt_ms(data)
    found: dict[str, float] = {}
    if rtt is None:
        return found
    for workload in WORKLOADS:
        for impl in workload.impls:
            if impl.script is None or impl.trips is None or impl.script in found:
                continue
            one = _summary(data, workload.key, impl.key, 1)
            if one is None or not one["p50_ms"]["n"]:
                continue
            found[impl.script] = max(0.0, one["p50_ms"]["min"] - impl.trips * rtt)
    return found


def of(data: dict[str, Any], workload: Workload, impl: Impl, procs: int) -> dict[str, Any] | None:
    """The floor of one row: ``time_ms`` per operation and the ``rate`` ceiling in units/s (``None``: unknown)."""
    rtt = rtt_ms(data)
    server = server_ms(data).get(impl.server or "")
    trips: float | None = impl.trips
    counted = (data.get("roundtrips") or {}).get(impl.counted or "")
    if counted is not None:
        trips = float(counted)
    if rtt is None or server is None or trips is None:
        return None
    time_ms = trips * rtt + server
    per_op = _units_per_op(data, workload.key, impl.key)
    rate = procs * per_op * 1000 / time_ms if time_ms > 0 else float("inf")
    if impl.held is not None and procs > 1:
        hold_ms = impl.held * rtt if impl.held else server
        rate = min(rate, per_op * 1000 / hold_ms if hold_ms > 0 else float("inf"))
    return {"trips": trips, "held": impl.held, "server_ms": server, "time_ms": time_ms, "rate": rate}


def _summary(data: dict[str, Any], workload: str, impl: str, procs: int) -> dict[str, Any] | None:
    for s in data["summaries"]:
        if s["workload"] == workload and s["impl"] == impl and s["procs"] == procs:
            return dict(s)
    return None


def _units_per_op(data: dict[str, Any], workload: str, impl: str) -> float:
    units = ops = 0
    for run in data["runs"]:
        if run["workload"] == workload and run["impl"] == impl:
            units += run["units"]
            ops += run["ops"]
    return units / ops if ops else 1.0
