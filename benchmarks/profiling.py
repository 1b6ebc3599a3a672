"""A cProfile of lockkit's hot path: uncontended reservations in this process, top entries by own time."""

from __future__ import annotations

import cProfile
import pstats
import random
from pathlib import Path
from typing import Any

from django.db import connections

from benchmarks import ops


def profile(name: str, count: int, top: int = 15) -> dict[str, Any]:
    """Profile ``count`` operations ``name`` (after ``count // 10`` unprofiled warm-up operations)."""
    op = ops.build(name, random.Random(7), 0)
    for _ in range(max(1, count // 10)):
        op()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(count):
        op()
    profiler.disable()
    connections.close_all()
    stats = pstats.Stats(profiler)
    entries = []
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]  # pstats keeps its table untyped
    for (filename, line, function), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        entries.append(
            {
                "function": f"{_short(filename)}:{line}({function})",
                "calls_per_op": calls / count,
                "own_us_per_op": tottime / count * 1e6,
                "cum_us_per_op": cumtime / count * 1e6,
            }
        )
    total = sum(e["own_us_per_op"] for e in entries)
    entries.sort(key=lambda e: e["own_us_per_op"], reverse=True)
    own_code = sorted(
        (e for e in entries if e["function"].startswith("lockkit/")),
        key=lambda e: e["cum_us_per_op"],
        reverse=True,
    )
    return {
        "op": name,
        "count": count,
        "profiled_us_per_op": total,
        "top": entries[:top],
        "lockkit_top": own_code[:top],
    }


_ROOT = str(Path(__file__).resolve().parents[1]) + "/"


def _short(filename: str) -> str:
    if filename.startswith(_ROOT):
        return filename[len(_ROOT) :]
    for marker in ("site-packages/", "/wt-bench/", "/main/", "lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename
