"""What a demo worker measured, and the totals of a scenario."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields


@dataclass
class Counters:
    """What every worker counts; ``Totals`` sums them field by field."""

    operations: int = 0
    successes: int = 0
    refusals: int = 0
    retries: int = 0
    lock_timeouts: int = 0
    errors: int = 0
    units: int = 0
    stale: int = 0
    reclaimed: int = 0
    first_error: str = ""


COUNTED = tuple(f.name for f in fields(Counters) if f.type in ("int", int))


@dataclass
class WorkerStats(Counters):
    """Counters and latencies of one worker process (sent back to the parent when it finishes)."""

    def confirm(self, sku: str, quantity: int) -> None:
        """Count a successful reservation of ``quantity`` units of ``sku``."""
        self.successes += 1
        self.units += quantity
        self.confirmed[sku] = self.confirmed.get(sku, 0) + quantity

    latencies: list[float] = field(default_factory=list)
    #: Units each SKU's successful reservations were told they got: what the buyers were promised.
    confirmed: dict[str, int] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0


@dataclass
class Totals(Counters):
    """The sum of a scenario's ``WorkerStats``, with latency percentiles and throughput."""

    confirmed: dict[str, int] = field(default_factory=dict)
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    seconds: float = math.nan

    @property
    def throughput(self) -> float:
        return self.operations / self.seconds if self.seconds and self.seconds > 0 else math.nan

    @classmethod
    def of(cls, workers: list[WorkerStats]) -> Totals:
        totals = cls()
        latencies: list[float] = []
        for w in workers:
            for name in COUNTED:
                setattr(totals, name, getattr(totals, name) + getattr(w, name))
            latencies.extend(w.latencies)
            for sku, units in w.confirmed.items():
                totals.confirmed[sku] = totals.confirmed.get(sku, 0) + units
            totals.first_error = totals.first_error or w.first_error
        if latencies:
            latencies.sort()
            totals.p50_ms = 1000 * _percentile(latencies, 0.50)
            totals.p99_ms = 1000 * _percentile(latencies, 0.99)
        if workers:
            totals.seconds = max(w.finished for w in workers) - min(w.started for w in workers)
        return totals


def _percentile(ordered: list[float], fraction: float) -> float:
    index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
    return ordered[index]
