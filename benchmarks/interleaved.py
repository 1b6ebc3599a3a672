"""Pairs interleaved in one process: the two sides alternate operation by operation, so both meet the same load.

The rounds of the main suite are seconds apart; on a shared machine a neighbour's burst can land on one side of a
pair. Here one process runs the candidate and the baseline alternately, one operation each (the order swapped
every pair), on one connection, and times every operation. The run is cut into ``CHUNKS`` consecutive chunks; in each
chunk the ratio of the two sides' median times is taken, and the ratios are summarised (median and min-max). A burst
lands on both sides within a millisecond, and a median per chunk ignores the operations it slowed. Time per
operation includes the round trips.
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
    (
        "uncontended",
        "reserve_lockkit",
        "reserve_hand",
        "lockkit save() / hand-written reservation, uncontended",
    ),
    (
        "lupdate",
        "reserve_locked_update",
        "reserve_hand",
        "lockkit.locked_update() / hand-written reservation, uncontended",
    ),
    (
        "claims",
        "claim_one",
        "claim_hand",
        "claim_next(limit=1) + complete / hand-written claim loop, one worker",
    ),
)
CHUNKS = 10


def run(operations: int, warmup: int = 100) -> list[dict[str, Any]]:
    """Alternate each pair for ``operations`` operations per side; return per pair the chunked time ratios."""
    results = []
    for key, candidate, baseline, label in PAIRS:
        if ops.missing(candidate) or ops.missing(baseline):
            continue
        connections.close_all()
        if key == "claims":
            schema.reset_jobs(2 * (operations + warmup) + 100)
        built = {name: ops.build(name, random.Random(3), 0) for name in (candidate, baseline)}
        for op in built.values():
            for _ in range(warmup):
                op()
        times: dict[str, list[float]] = {candidate: [], baseline: []}
        pair = (built[candidate], built[baseline])
        for number in range(operations):
            order = (0, 1) if number % 2 == 0 else (1, 0)
            for side in order:
                op = pair[side]
                started = time.perf_counter()
                op()
                times[(candidate, baseline)[side]].append((time.perf_counter() - started) * 1e6)
        size = max(1, operations // CHUNKS)
        ratios = [
            statistics.median(times[candidate][i : i + size])
            / statistics.median(times[baseline][i : i + size])
            for i in range(0, size * CHUNKS if operations >= CHUNKS else operations, size)
        ]
        results.append(
            {
                "key": key,
                "label": label,
                "operations": operations,
                "chunks": len(ratios),
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
