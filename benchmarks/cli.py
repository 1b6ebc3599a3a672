"""``python -m benchmarks``: run every workload, then write JSON, the Markdown report and the chart.

Without ``--database-url`` an embedded PostgreSQL is started for the run; pgbench is pointed at the same server.
Only the benchmark's own tables (``lkbench_*``) are created, written and dropped.
"""

from __future__ import annotations

import argparse
import atexit
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

from benchmarks import dbserver, network, plan
from benchmarks.plan import Settings
from benchmarks.results import Run

FULL = Settings(rounds=5, warmup_rounds=1, warmup=0.5, duration=1.5, quick=False)
QUICK = Settings(rounds=2, warmup_rounds=0, warmup=0.1, duration=0.3, quick=True)
#: Where a run writes benchmarks.md/.png/.json without ``--out`` (git-ignored). ``--out docs`` publishes them.
RESULTS_DIR = Path(__file__).resolve().parent / "results"


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
        help="directory for benchmarks.md/.png/.json (default: benchmarks/results/; --quick: a temporary one;"
        " --out docs updates the published report)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--only", nargs="+", default=None, help="workload keys to run (default: all)")
    parser.add_argument(
        "--procs",
        nargs="+",
        default=[],
        metavar="WORKLOAD=N[,N...]",
        help="the process counts of a workload, e.g. hot=4,8 claims=2 (default: the workload's own)",
    )
    parser.add_argument(
        "--interleaved",
        type=int,
        default=None,
        metavar="OPS",
        help="operations per side of each interleaved pair (default 3000, --quick 100; 0, or --only without it, "
        "skips them)",
    )
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
    parser.add_argument(
        "--rtt",
        type=float,
        default=0.0,
        metavar="MS",
        help="run every workload (and pgbench) through a latency relay adding MS milliseconds of round trip on "
        "loopback (compiled with cc; calibrated with a SELECT 1 loop; default 0: plain loopback)",
    )
    return parser  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not 0 <= args.rtt <= 100:
        parser.error(f"--rtt must be between 0 and 100 milliseconds, got {args.rtt}")
    try:
        args.procs = _procs(args.procs)
    except ValueError as exc:
        parser.error(f"--procs: {exc}")
    started = time.monotonic()
    log = _printer()
    target, net = _connect(args)
    # Imported after Django's setup: they define or use models.
    from benchmarks import schema, stats, sysinfo

    out = _out_dir(args)
    load_before = sysinfo.load()
    log(f"database: {'embedded ' if target.embedded else ''}{target.host}:{target.port}/{target.dbname}")
    if net["measured"]:
        m = net["measured"]
        log(
            f"network: latency relay, {net['rtt_ms']} ms asked (relay delay {net['relay_delay_ms']} ms): SELECT 1 "
            f"round trip {m['median_ms']:.3f} ms ({m['min_ms']:.3f}-{m['max_ms']:.3f}); "
            f"loopback {net['loopback']['median_ms']:.3f} ms"
        )
    else:
        log(f"network: loopback, SELECT 1 round trip {net['loopback']['median_ms']:.3f} ms")
    log(f"load average before: {load_before}")
    schema.create()
    system = sysinfo.collect(target.embedded)
    log(f"server: {system['versions']['postgresql']}; {system['server']['settings']}")
    settings = _settings(args)
    net["pgbench_select1"] = _select1(target, settings, log)
    runs, skipped = _run_workloads(args, target, settings, log)
    extra = {"interleaved": _interleaved(args, log), "roundtrips": _roundtrips(log)}
    profile = None if args.no_profile else _profile(args.quick, log)
    summaries = stats.summarise(runs)
    extra["network"] = net
    data = _results(args, argv, settings, load_before, system, skipped, runs, summaries, profile, extra)
    _write(out, args.json, data, summaries, log)
    for t in data["targets"]:
        verdict = (
            "reference" if t.get("reference") else {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        )
        log(f"target: {t['target']}: {t['measured']} ({verdict})")
    log(f"load average after: {data['load']['after']}")
    log(f"done in {time.monotonic() - started:.0f} s")
    return 0


def _connect(args: argparse.Namespace) -> tuple[dbserver.Target, dict[str, Any]]:
    """Set the sessions' ``synchronous_commit``, find or start the server (behind the relay with ``--rtt``), and set
    Django up on it. Returns the target and the network's figures (``benchmarks.network``)."""
    if args.synchronous_commit != "server":
        # libpq reads PGOPTIONS, so Django's connections and pgbench's start with the same session setting.
        os.environ["PGOPTIONS"] = (
            f"{os.environ.get('PGOPTIONS', '')} -c synchronous_commit={args.synchronous_commit}"
        )
    target = dbserver.target(args.database_url or None)
    if args.rtt:
        target, relay, figures = network.through_relay(target, args.rtt)
        atexit.register(relay.close)
    else:
        figures = network.loopback(target)
    os.environ["LOCKKIT_BENCH_DATABASE_URL"] = target.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    return target, figures


def _out_dir(args: argparse.Namespace) -> Path:
    """``--out``, else ``benchmarks/results/`` (git-ignored; a temporary directory for ``--quick``), created."""
    out: Path = args.out or (Path(tempfile.mkdtemp(prefix="lkbench-")) if args.quick else RESULTS_DIR)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _settings(args: argparse.Namespace) -> Settings:
    """The rounds and durations: ``--quick`` or the full defaults, overridden by the options given."""
    defaults = QUICK if args.quick else FULL
    return dataclasses.replace(
        defaults,
        rounds=args.rounds or defaults.rounds,
        warmup_rounds=defaults.warmup_rounds if args.warmup_rounds is None else args.warmup_rounds,
        warmup=defaults.warmup if args.warmup is None else args.warmup,
        duration=args.duration or defaults.duration,
    )


def _run_workloads(
    args: argparse.Namespace, target: dbserver.Target, settings: Settings, log: Callable[[str], None]
) -> tuple[list[Run], dict[str, str]]:
    """Run the selected workloads (without pgbench's implementations when pgbench is missing)."""
    from benchmarks import ops, pgbench, runner

    skipped: dict[str, str] = {}
    runs: list[Run] = []
    for workload in plan.WORKLOADS:
        if args.only and workload.key not in args.only:
            continue
        if workload.key in args.procs:
            counts = args.procs[workload.key]
            workload = dataclasses.replace(workload, procs=counts, quick_procs=counts)
        absent = {i.key: why for i in workload.impls if i.op and (why := ops.missing(i.op))}
        if absent:
            workload = _restricted(workload, _without(frozenset(absent)))
            skipped[workload.key] = "not run: " + "; ".join(f"{key} ({why})" for key, why in absent.items())
        if pgbench.executable() is None:
            workload = _restricted(workload, lambda impl: impl.script is None)
            skipped.setdefault("pgbench", "pgbench not found: the pgbench ceiling was not measured")
        if not workload.impls:
            continue
        log(workload.title)
        runs += runner.run_workload(workload, target, settings, log)
    return runs, skipped


def _select1(
    target: dbserver.Target, settings: Settings, log: Callable[[str], None]
) -> dict[str, float] | None:
    """pgbench's ``SELECT 1`` at one client: the round trip without Python's own time (the physical floor's RTT)."""
    from benchmarks import pgbench

    if pgbench.executable() is None:
        return None
    run = pgbench.run(target, "network", "select1", "select1", 1, 0, settings.warmup, settings.duration)
    log(f"network: pgbench SELECT 1 round trip p50 {run.p50_ms:.3f} ms")
    return {"p50_ms": run.p50_ms, "p99_ms": run.p99_ms}


def _interleaved(args: argparse.Namespace, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The pairs alternated operation by operation in one process (skipped with ``--only`` unless asked)."""
    from benchmarks import interleaved

    operations = args.interleaved
    if operations is None:
        operations = 0 if args.only else 100 if args.quick else 3000
    if operations <= 0:
        return []
    pairs = interleaved.run(operations=operations)
    for pair in pairs:
        t = pair["time_ratio"]
        log(f"interleaved: {pair['label']}: {t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f})")
    return pairs


def _roundtrips(log: Callable[[str], None]) -> dict[str, float] | None:
    """Round trips per operation, counted with strace (``None`` without strace)."""
    from benchmarks import roundtrips

    trips = roundtrips.count()
    log(f"round trips per operation (strace): {trips if trips is not None else 'strace not available'}")
    return trips


def _profile(quick: bool, log: Callable[[str], None]) -> dict[str, Any]:
    """cProfile the hot path (a lockkit reservation, the hand-written one, a claim), then the lock-hold window of
    the reservations (``benchmarks.holdprofile``)."""
    from benchmarks import holdprofile, profiling, schema

    count = 200 if quick else 3000
    profile = profiling.profile("reserve_lockkit", count)
    profile["hand"] = profiling.profile("reserve_hand", count)
    schema.reset_jobs(count * 2)
    profile["claims"] = profiling.profile("claim_one", count, top=10)
    log(
        f"profile: {profile['profiled_us_per_op']:.0f} µs per lockkit operation under cProfile, "
        f"{profile['hand']['profiled_us_per_op']:.0f} µs hand-written"
    )
    profile["hold"] = {}
    for name in holdprofile.MODES:
        try:
            hold = holdprofile.profile(name, count)
        except Exception as exc:  # an operation this lockkit cannot run is left out of the profile, said so
            log(f"lock-hold profile of {name}: not measured ({type(exc).__name__}: {exc})")
            continue
        profile["hold"][name] = hold
        log(
            f"lock-hold profile of {name}: {hold['window_us']:.0f} µs per window under the tracer "
            f"({hold['wait_us']:.0f} µs waiting on the server, {hold['calls']:.0f} Python calls, lockkit's own "
            f"{hold['lockkit_own_us']:.0f} µs)"
        )
    return profile


def _results(
    args: argparse.Namespace,
    argv: list[str] | None,
    settings: Settings,
    load_before: Any,
    system: dict[str, Any],
    skipped: dict[str, str],
    runs: list[Run],
    summaries: list[Any],
    profile: dict[str, Any] | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """Every figure of the run, as the JSON written next to the report (and the report's input)."""
    from benchmarks import report, stats, sysinfo

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
        **extra,
    }
    data["targets"] = report.targets(data)
    return data


def _write(
    out: Path, also_json: Path | None, data: dict[str, Any], summaries: list[Any], log: Callable[[str], None]
) -> None:
    """Write benchmarks.json (and ``--json``), the chart and the report section of benchmarks.md in ``out``."""
    from benchmarks import chart, report

    stem = report.file_stem(data)
    for path in {out / f"{stem}.json", *([also_json] if also_json else [])}:
        path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    drawn = chart.draw(summaries, out / f"{stem}.png")
    section = report.render(data, f"{stem}.png" if drawn else None)
    report.write(out / "benchmarks.md", section, report.network_label(data))
    log(
        f"wrote {out / 'benchmarks.md'}, {out / f'{stem}.json'}"
        + (f", {out / f'{stem}.png'}" if drawn else "")
    )


def _procs(given: list[str]) -> dict[str, tuple[int, ...]]:
    """``["hot=4,8", "claims=2"]`` as ``{"hot": (4, 8), "claims": (2,)}``.

    Raises:
        ValueError: an unknown workload or a count that is not a positive integer.
    """
    keys = {workload.key for workload in plan.WORKLOADS}
    found: dict[str, tuple[int, ...]] = {}
    for item in given:
        key, _, counts = item.partition("=")
        if key not in keys:
            raise ValueError(f"unknown workload {key!r} in {item!r} (one of {', '.join(sorted(keys))})")
        try:
            numbers = tuple(int(n) for n in counts.split(","))
        except ValueError:
            raise ValueError(f"{item!r}: process counts are integers, as in hot=4,8") from None
        if not numbers or min(numbers) < 1:
            raise ValueError(f"{item!r}: process counts are positive")
        found[key] = numbers
    return found


def _restricted(workload: plan.Workload, keep: Callable[[plan.Impl], bool]) -> plan.Workload:
    impls = tuple(i for i in workload.impls if keep(i))
    pairs = tuple(p for p in workload.pairs if all(k in {i.key for i in impls} for k in p))
    return dataclasses.replace(workload, impls=impls, pairs=pairs)


def _without(keys: frozenset[str]) -> Callable[[plan.Impl], bool]:
    def keep(impl: plan.Impl) -> bool:
        return impl.key not in keys

    return keep


def _printer() -> Callable[[str], None]:
    def log(message: str) -> None:
        print(message, flush=True)

    return log
