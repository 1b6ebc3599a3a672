"""``python -m benchmarks``: run every workload, then write JSON, the Markdown report and the chart.

Without ``--database-url`` an embedded PostgreSQL is started for the run; pgbench is pointed at the same server.
Only the benchmark's own tables (``lkbench_*``) are created, written and dropped.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import dbserver, plan
from benchmarks.plan import Settings

FULL = Settings(rounds=5, warmup_rounds=1, warmup=0.5, duration=1.5, quick=False)
QUICK = Settings(rounds=2, warmup_rounds=0, warmup=0.1, duration=0.3, quick=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: few, short rounds (under 2 minutes)"
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("LOCKKIT_BENCH_DATABASE_URL", ""),
        help="postgres://... of a database for the benchmark's tables (default: embedded server)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for benchmarks.md/.png/.json (default: docs/; --quick: a temporary one)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--only", nargs="+", default=None, help="workload keys to run (default: all)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--warmup-rounds", type=int, default=None)
    parser.add_argument("--duration", type=float, default=None, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=None, help="seconds of warm-up per run, not measured")
    parser.add_argument(
        "--synchronous-commit",
        choices=("off", "on", "server"),
        default="off",
        help="the benchmark sessions' synchronous_commit (default off: commits do not wait for the WAL flush, so "
        "the figures show round trips and CPU rather than the disk's fsync latency; 'server' keeps the server's)",
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile of the hot path")
    return parser  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.monotonic()
    if args.synchronous_commit != "server":
        # libpq reads PGOPTIONS, so Django's connections and pgbench's start with the same session setting.
        os.environ["PGOPTIONS"] = (
            f"{os.environ.get('PGOPTIONS', '')} -c synchronous_commit={args.synchronous_commit}"
        )
    target = dbserver.target(args.database_url or None)
    os.environ["LOCKKIT_BENCH_DATABASE_URL"] = target.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    # Imported after setup: they define or use models.
    from benchmarks import (
        chart,
        interleaved,
        pgbench,
        profiling,
        report,
        roundtrips,
        runner,
        schema,
        stats,
        sysinfo,
    )

    defaults = QUICK if args.quick else FULL
    settings = dataclasses.replace(
        defaults,
        rounds=args.rounds or defaults.rounds,
        warmup_rounds=defaults.warmup_rounds if args.warmup_rounds is None else args.warmup_rounds,
        warmup=defaults.warmup if args.warmup is None else args.warmup,
        duration=args.duration or defaults.duration,
    )
    out: Path = args.out or (Path(tempfile.mkdtemp(prefix="lkbench-")) if args.quick else Path("docs"))
    out.mkdir(parents=True, exist_ok=True)
    log = _printer()
    load_before = sysinfo.load()
    log(f"database: {'embedded ' if target.embedded else ''}{target.host}:{target.port}/{target.dbname}")
    log(f"load average before: {load_before}")
    schema.create()
    system = sysinfo.collect(target.embedded)
    log(f"server: {system['versions']['postgresql']}; {system['server']['settings']}")

    skipped: dict[str, str] = {}
    runs = []
    for workload in plan.WORKLOADS:
        if args.only and workload.key not in args.only:
            continue
        if pgbench.executable() is None:
            workload = _restricted(workload, lambda impl: impl.script is None)
            skipped.setdefault("pgbench", "pgbench not found: the pgbench ceiling was not measured")
        if not workload.impls:
            continue
        log(workload.title)
        runs += runner.run_workload(workload, target, settings, log)

    pairs = interleaved.run(operations=100 if args.quick else 3000) if not args.only else []
    for pair in pairs:
        t = pair["time_ratio"]
        log(f"interleaved: {pair['label']}: {t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f})")

    trips = roundtrips.count()
    log(f"round trips per operation (strace): {trips if trips is not None else 'strace not available'}")

    profile: dict[str, Any] | None = None
    if not args.no_profile:
        count = 200 if args.quick else 3000
        profile = profiling.profile("reserve_lockkit", count)
        profile["hand"] = profiling.profile("reserve_hand", count)
        schema.reset_jobs(count * 2)
        profile["claims"] = profiling.profile("claim_one", count, top=10)
        log(
            f"profile: {profile['profiled_us_per_op']:.0f} µs per lockkit operation under cProfile, "
            f"{profile['hand']['profiled_us_per_op']:.0f} µs hand-written"
        )

    summaries = stats.summarise(runs)
    ratio_list = [r for w in plan.WORKLOADS for r in stats.ratios(runs, w.key, w.pairs)]
    data: dict[str, Any] = {
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "quick": args.quick,
        "method": {
            "rounds": settings.rounds,
            "warmup_rounds": settings.warmup_rounds,
            "warmup_s": settings.warmup,
            "duration_s": settings.duration,
        },
        "load": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in sysinfo.load()],
        },
        "system": system,
        "skipped": skipped,
        "runs": [r.as_dict() for r in runs],
        "summaries": [s.as_dict() for s in summaries],
        "ratios": [r.as_dict() for r in ratio_list],
        "profile": profile,
        "roundtrips": trips,
        "interleaved": pairs,
    }
    data["targets"] = report.targets(data)
    for path in {out / "benchmarks.json", *([args.json] if args.json else [])}:
        path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    drawn = chart.draw(summaries, out / "benchmarks.png")
    report.write(out / "benchmarks.md", report.render(data, "benchmarks.png" if drawn else None))
    for t in data["targets"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        log(f"target: {t['target']}: {t['measured']} ({verdict})")
    log(f"load average after: {data['load']['after']}")
    log(
        f"wrote {out / 'benchmarks.md'}, {out / 'benchmarks.json'}"
        + (f", {out / 'benchmarks.png'}" if drawn else "")
    )
    log(f"done in {time.monotonic() - started:.0f} s")
    return 0


def _restricted(workload: plan.Workload, keep: Callable[[plan.Impl], bool]) -> plan.Workload:
    impls = tuple(i for i in workload.impls if keep(i))
    pairs = tuple(p for p in workload.pairs if all(k in {i.key for i in impls} for k in p))
    return dataclasses.replace(workload, impls=impls, pairs=pairs)


def _printer() -> Any:
    def log(message: str) -> None:
        print(message, flush=True)

    return log
