"""Pairs interleaved in one process: short alternating blocks of operations, so both sides meet the same load.

The rounds of the main suite are seconds apart; on a shared machine a neighbour's burst can land on one side of a
pair. Here one process alternates blocks of ``BLOCK`` operations of the candidate and the baseline (the order
swapped every round) on one connection, and the ratio of each round's two blocks is summarised (median and min-max):
a burst now lands on both sides within milliseconds. Time per operation includes the round trips.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from django.db import connections

from benchmarks import ops, schema

#: (key, candidate op, baseline op, label)
PAIRS: tuple[tuple[str, str, str, str], ...] = (
    ("uncontended", "reserve_lockkit", "reserve_hand", "lockkit / hand-written reservation, uncontended"),
    (
        "claims",
        "claim_one",
        "claim_hand",
        "claim_next(limit=1) + complete / hand-written claim loop, one worker",
    ),
)
BLOCK = 10


def run(rounds: int, warmup: int = 100) -> list[dict[str, Any]]:
    """Interleave each pair for ``rounds`` rounds; return per pair the median and range of the time ratio."""
    results = []
    for key, candidate, baseline, label in PAIRS:
        connections.close_all()
        if key == "claims":
            schema.reset_jobs((rounds * 2 + 4) * BLOCK + 2 * warmup)
        built = {name: ops.build(name, random.Random(3), 0) for name in (candidate, baseline)}
        for op in built.values():
            for _ in range(warmup):
                op()
        times: dict[str, list[float]] = {candidate: [], baseline: []}
        for number in range(rounds):
            order = (candidate, baseline) if number % 2 == 0 else (baseline, candidate)
            for name in order:
                op = built[name]
                started = time.perf_counter()
                for _ in range(BLOCK):
                    op()
                times[name].append((time.perf_counter() - started) / BLOCK * 1e6)
        ratios = [c / b for c, b in zip(times[candidate], times[baseline], strict=True)]
        results.append(
            {
                "key": key,
                "label": label,
                "rounds": rounds,
                "block": BLOCK,
                "candidate_us": statistics.median(times[candidate]),
                "baseline_us": statistics.median(times[baseline]),
                "time_ratio": {
                    "median": statistics.median(ratios),
                    "min": min(ratios),
                    "max": max(ratios),
                    "n": len(ratios),
                },
            }
        )
    connections.close_all()
    return results
