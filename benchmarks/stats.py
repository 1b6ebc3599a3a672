"""Summaries of the rounds: medians with min-max per implementation, and ratios computed pair by pair."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from benchmarks.results import Run


@dataclass(frozen=True)
class Spread:
    """The median and the range of one figure over the rounds."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        clean = [v for v in values if v == v]  # drop NaN
        if not clean:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(clean), min(clean), max(clean), len(clean))

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


@dataclass(frozen=True)
class Summary:
    """One implementation at one process count, over the measured rounds."""

    workload: str
    impl: str
    procs: int
    rate: Spread
    us_per_op: Spread
    p50_ms: Spread
    p99_ms: Spread
    lock_waiting: Spread
    errors: dict[str, int]
    retries: int
    deadlocks: int
    exhausted: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "impl": self.impl,
            "procs": self.procs,
            "rate": self.rate.as_dict(),
            "us_per_op": self.us_per_op.as_dict(),
            "p50_ms": self.p50_ms.as_dict(),
            "p99_ms": self.p99_ms.as_dict(),
            "lock_waiting": self.lock_waiting.as_dict(),
            "errors": self.errors,
            "retries": self.retries,
            "deadlocks": self.deadlocks,
            "exhausted": self.exhausted,
        }


@dataclass(frozen=True)
class Ratio:
    """``candidate / baseline`` throughput, computed within each round, then summarised.

    ``time`` is the inverse (time per operation), the form of the uncontended target.
    """

    workload: str
    procs: int
    candidate: str
    baseline: str
    rate: Spread
    time: Spread

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "procs": self.procs,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "rate_ratio": self.rate.as_dict(),
            "time_ratio": self.time.as_dict(),
        }


def summarise(runs: list[Run]) -> list[Summary]:
    keys = sorted({(r.workload, r.procs, r.impl) for r in runs}, key=lambda k: (k[0], k[1]))
    result = []
    for workload, procs, impl in keys:
        mine = [r for r in runs if (r.workload, r.procs, r.impl) == (workload, procs, impl)]
        errors: dict[str, int] = {}
        for run in mine:
            for name, count in run.errors.items():
                errors[name] = errors.get(name, 0) + count
        result.append(
            Summary(
                workload,
                impl,
                procs,
                Spread.of([r.rate for r in mine]),
                Spread.of([r.us_per_op for r in mine]),
                Spread.of([r.p50_ms for r in mine]),
                Spread.of([r.p99_ms for r in mine]),
                Spread.of([r.lock_waiting for r in mine]),
                errors,
                sum(r.retries for r in mine),
                sum(r.deadlocks for r in mine),
                any(r.exhausted for r in mine),
            )
        )
    return result


def ratios(runs: list[Run], workload: str, pairs: tuple[tuple[str, str], ...]) -> list[Ratio]:
    result = []
    for procs in sorted({r.procs for r in runs if r.workload == workload}):
        by_round: dict[tuple[str, int], Run] = {
            (r.impl, r.round): r for r in runs if r.workload == workload and r.procs == procs
        }
        for candidate, baseline in pairs:
            rate_ratios = [
                run.rate / other.rate
                for (impl, number), run in by_round.items()
                if impl == candidate
                and (other := by_round.get((baseline, number))) is not None
                and other.rate > 0
                and run.rate > 0
            ]
            if rate_ratios:
                result.append(
                    Ratio(
                        workload,
                        procs,
                        candidate,
                        baseline,
                        Spread.of(rate_ratios),
                        Spread.of([1 / x for x in rate_ratios]),
                    )
                )
    return result
