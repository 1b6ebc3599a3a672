"""One measured run, whoever drove it (Django processes or pgbench), in the form every report reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Run:
    """The figures of one run of one implementation, measured over its window (warm-up excluded).

    Attributes:
        workload, impl: What ran. procs: processes (pgbench: clients). round: the round number (1-based).
        units: operations (or jobs) completed in the window; seconds: the window's length.
        latencies_ms: p50 and p99 of one operation, in milliseconds.
        lock_waiting: the mean number of sessions waiting on a lock (ungranted ``pg_locks`` rows, sampled by
            ``lockkit.testing.LockWaitMonitor``).
        errors: failed operations by exception name; retries, deadlocks: seen by lockkit's retry hook.
        exhausted: the job queue ran dry (the rate is then a lower bound).
    """

    workload: str
    impl: str
    procs: int
    round: int
    units: int
    ops: int
    seconds: float
    p50_ms: float
    p99_ms: float
    lock_waiting: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    deadlocks: int = 0
    exhausted: bool = False

    @property
    def rate(self) -> float:
        """Units per second."""
        return self.units / self.seconds if self.seconds > 0 else 0.0

    @property
    def us_per_op(self) -> float:
        """Mean wall time per operation in microseconds (meaningful for one process)."""
        return self.seconds / self.ops * 1e6 if self.ops else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate": self.rate, "us_per_op": self.us_per_op}


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]
