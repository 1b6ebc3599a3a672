"""The PNG chart: throughput against processes, one line per implementation (hot row and claims)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.plan import WORKLOADS
from benchmarks.stats import Summary


def draw(summaries: list[Summary], path: Path) -> bool:
    """Draw the contended workloads that ran with several process counts; return whether a chart was written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [w for w in WORKLOADS if len({s.procs for s in summaries if s.workload == w.key}) > 1]
    if not panels:
        return False
    columns = min(2, len(panels))
    rows = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(7 * columns, 4.8 * rows), squeeze=False)
    for axis in axes.flat[len(panels) :]:
        axis.set_visible(False)
    for axis, workload in zip(axes.flat, panels, strict=False):
        for impl in workload.impls:
            mine = sorted(
                (s for s in summaries if s.workload == workload.key and s.impl == impl.key),
                key=lambda s: s.procs,
            )
            if not mine:
                continue
            xs = [s.procs for s in mine]
            axis.errorbar(
                xs,
                [s.rate.median for s in mine],
                yerr=[
                    [s.rate.median - s.rate.low for s in mine],
                    [s.rate.high - s.rate.median for s in mine],
                ],
                marker="o",
                capsize=3,
                label=impl.label,
            )
        axis.set_title(workload.title, fontsize=10)
        axis.set_xlabel("processes (pgbench: clients)")
        # Logarithmic: pgbench runs an order of magnitude above Django; ratios read as equal distances.
        axis.set_yscale("log")
        axis.set_ylabel(f"{workload.unit} per second (median, min-max; log scale)")
        axis.set_xscale("log", base=2)
        axis.set_xticks(sorted({s.procs for s in summaries if s.workload == workload.key}))
        axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
