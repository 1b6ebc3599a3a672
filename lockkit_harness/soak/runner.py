"""Running a soak: the cluster, the proxy, the workers, the fault schedule, the drain and the reconciliation."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import psycopg
from rich.console import Console
from rich.table import Table

from lockkit_harness.cluster import TempCluster
from lockkit_harness.proxy import FaultProxy
from lockkit_harness.soak.injector import Injector
from lockkit_harness.soak.plan import PLENTIFUL, SCARCE, Fault, SoakOptions, schedule
from lockkit_harness.soak.reconcile import Check, Logs, read_logs, reconcile, table
from lockkit_harness.soak.worker import SETTINGS_MODULE, Shared, run_worker

WEDGE_SECONDS = 15.0  # a live worker with no successful operation for this long is wedged
STARTUP_GRACE = (
    60.0  # a new incarnation's process start and Django setup, under load, before its first success
)
INITIAL_JOBS = 200
DRAIN_TIMEOUT = 180.0
TICK = 0.1
_IDLE_IN_TRANSACTION = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%%' "
    "AND now() - state_change > interval '5 seconds'"
)


@dataclass
class _Slot:
    """One worker position: its current process and incarnation, and whether the soak killed it."""

    index: int
    url: str
    process: Any = None
    incarnation: int = 0
    started: float = 0.0
    killed_by_us: bool = False
    wedged: bool = False


@dataclass
class Outcome:
    """What a soak run found; ``exit_code`` is 1 when an invariant is violated."""

    checks: list[Check]
    logs: Logs
    faults: list[Fault]
    injected: dict[str, int]
    missed: dict[str, int]
    cuts: dict[str, int]
    throughput: dict[str, float]
    operations: int
    seconds: float
    restart_seconds: list[float] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(check.violated for check in self.checks) else 0


class _Workers:
    def __init__(self, options: SoakOptions, urls: list[str], log_dir: Path) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        n = options.workers
        # lock=False: each worker writes only its own slot, and a worker SIGKILLed while holding a shared lock
        # would block every other worker for ever (the soak would wedge its own workers).
        self.shared = Shared(
            self.ctx.Array("d", n, lock=False),
            self.ctx.Array("q", n, lock=False),
            self.ctx.Event(),
            self.ctx.Event(),
        )
        self.options = options
        self.log_dir = log_dir
        self.slots = [_Slot(i, urls[i]) for i in range(n)]
        self.crashes = 0
        self.kills = 0

    def start(self, slot: _Slot) -> None:
        slot.incarnation += 1
        slot.killed_by_us = False
        slot.wedged = False
        slot.started = time.time()
        self.shared.progress[slot.index] = slot.started
        log_path = str(self.log_dir / f"worker-{slot.index}.log")
        args = (
            slot.index,
            slot.incarnation,
            slot.url,
            log_path,
            self.options.seed,
            self.options.lease,
            self.shared,
            self.options.mutation,
        )
        slot.process = self.ctx.Process(target=run_worker, args=args, name=f"soak-worker-{slot.index}")
        slot.process.start()

    def kill(self, index: int) -> bool:
        slot = self.slots[index]
        if slot.process is None or not slot.process.is_alive():
            return False
        slot.killed_by_us = True
        slot.process.kill()
        self.kills += 1
        return True

    def supervise(self, *, restart: bool) -> int:
        """Restart workers that died; count crashes; return how many newly wedged workers were seen."""
        wedged = 0
        now = time.time()
        for slot in self.slots:
            process = slot.process
            if process is not None and process.exitcode is not None:
                process.join(5)
                if not slot.killed_by_us and process.exitcode != 0:
                    self.crashes += 1
                if restart and (slot.killed_by_us or process.exitcode != 0):
                    self.start(slot)
                else:
                    slot.process = None
                continue
            if process is None or slot.wedged:
                continue
            last_success = self.shared.progress[slot.index]
            # Progress is the time of the last *successful* operation: failing every call is not working.
            if last_success > slot.started:
                stuck = now - last_success > WEDGE_SECONDS
            else:  # this incarnation has not succeeded yet: its start (Django setup, under load) gets a grace
                stuck = now - slot.started > STARTUP_GRACE
            if stuck:
                slot.wedged = True
                wedged += 1
        return wedged

    def all_wedged(self) -> bool:
        """Every live worker is wedged: the drain cannot end by itself (they are stopped instead)."""
        live = [slot for slot in self.slots if slot.process is not None and slot.process.is_alive()]
        return bool(live) and all(slot.wedged for slot in live)

    def wait_until_working(self, timeout: float = 120.0) -> None:
        """Return once every worker has finished an operation (process start and Django setup are not load)."""
        deadline = time.monotonic() + timeout
        while any(count == 0 for count in self.shared.operations[:]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers had not all started working after {timeout:.0f}s")
            self.supervise(restart=True)
            time.sleep(TICK)
        for slot in self.slots:
            slot.started = time.time()  # the wedge clock starts with the load

    def alive(self) -> int:
        return sum(1 for slot in self.slots if slot.process is not None and slot.process.is_alive())

    def total(self) -> int:
        return int(sum(self.shared.operations[:]))

    def stop(self) -> None:
        self.shared.stop.set()
        for slot in self.slots:
            if slot.process is not None:
                slot.process.join(30)
                if slot.process.is_alive():
                    slot.process.kill()
                    slot.process.join(10)


@dataclass(frozen=True)
class _Target:
    """The soak's database: on its own cluster, or the one ``--database-url`` names."""

    host: str
    port: int
    user: str
    password: str
    dbname: str

    @classmethod
    def of(cls, url: str) -> _Target:
        parts = urlsplit(url)
        if parts.scheme not in {"postgres", "postgresql"} or not parts.path.strip("/"):
            raise ValueError(f"database_url must be postgres://user@host:port/dbname, got {url!r}")
        return cls(
            unquote(parts.hostname or "") or "127.0.0.1",
            parts.port or 5432,
            unquote(parts.username or "postgres"),
            unquote(parts.password or ""),
            unquote(parts.path.strip("/")),
        )

    def url(self, *, host: str | None = None, port: int | None = None, sslmode: str | None = None) -> str:
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        query = f"?sslmode={sslmode}" if sslmode else ""
        location = quote(host or self.host, safe="")
        return f"postgres://{auth}@{location}:{port or self.port}/{quote(self.dbname, safe='')}{query}"

    def upstream(self) -> tuple[str, int] | str:
        """Where the proxy connects: TCP, or the Unix socket of a socket directory."""
        return f"{self.host}/.s.PGSQL.{self.port}" if self.host.startswith("/") else (self.host, self.port)

    def describe(self) -> str:
        return f"{self.dbname} on {self.host}:{self.port}"


def _setup_database(cluster: TempCluster | None, url: str) -> None:
    """Create the soak's database on its own cluster, or empty the one it was pointed at; migrate; fill it."""
    if cluster is not None:
        with psycopg.connect(cluster.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE soak")
    else:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("DROP SCHEMA IF EXISTS public CASCADE")
            admin.execute("CREATE SCHEMA public")
    os.environ["SAMPLE_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    import django

    django.setup()
    from django.core.management import call_command

    from sample_project.inventory.models import Stock
    from sample_project.jobs.services import enqueue

    call_command("migrate", run_syncdb=True, verbosity=0)
    Stock.objects.bulk_create(
        [Stock(sku=sku, available=units) for sku, units in {**SCARCE, **PLENTIFUL}.items()]
    )
    for _ in range(INITIAL_JOBS):
        enqueue("soak", {"by": "setup"})


def _database_state() -> dict[str, Any]:
    from django.db import connections
    from django.db.models import Sum

    from lockkit_harness.soak.models import Order
    from sample_project.inventory.models import Reservation, Stock
    from sample_project.jobs.models import Job, JobRun

    connections.close_all()  # the setup's connection did not survive the restarts
    runs: dict[int, list[int]] = defaultdict(list)
    for job_id, token in JobRun.objects.values_list("job_id", "token"):
        runs[job_id].append(token)
    return {
        "stock": dict(Stock.objects.values_list("sku", "available")),
        "reserved": {
            row["stock_id"]: row["units"]
            for row in Reservation.objects.values("stock_id").annotate(units=Sum("quantity"))
        },
        "ordered": {
            row["sku"]: row["units"] for row in Order.objects.values("sku").annotate(units=Sum("quantity"))
        },
        "order_refs": set(Order.objects.values_list("ref", flat=True)),
        "runs": dict(runs),
        "unfinished_jobs": Job.objects.exclude(state=Job.State.DONE).count(),
    }


def _rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    inside = [(t, n) for t, n in samples if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def _schedule_table(faults: list[Fault], options: SoakOptions) -> Table:
    counts: dict[str, int] = defaultdict(int)
    for fault in faults:
        counts[fault.kind] += 1
    result = Table(title=f"Fault schedule (seed {options.seed}): {len(faults)} faults")
    result.add_column("fault")
    result.add_column("count", justify="right")
    result.add_column("first at (s)", justify="right")
    for kind, count in sorted(counts.items()):
        first = min(f.at for f in faults if f.kind == kind)
        result.add_row(kind, str(count), f"{first:.1f}")
    return result


def _load(
    options: SoakOptions, faults: list[Fault], workers: _Workers, injector: Injector
) -> tuple[list[tuple[float, int]], set[int], int]:
    """The timed load with the fault schedule; returns throughput samples, idle-in-transaction pids, wedges."""
    samples: list[tuple[float, int]] = []
    idle_pids: set[int] = set()
    wedged = 0
    began = time.monotonic()
    pending = list(faults)
    last_sample = -1.0
    while (elapsed := time.monotonic() - began) < options.duration:
        while pending and pending[0].at <= elapsed:
            injector.run(pending.pop(0))
        wedged += workers.supervise(restart=True)
        if elapsed - last_sample >= 1.0:
            last_sample = elapsed
            samples.append((elapsed, workers.total()))
            with contextlib.suppress(psycopg.Error):  # the server is restarting: the next sample sees it
                idle_pids.update(row[0] for row in injector.query(_IDLE_IN_TRANSACTION))
        time.sleep(TICK)
    samples.append((time.monotonic() - began, workers.total()))
    return samples, idle_pids, wedged


def _drain(workers: _Workers, injector: Injector) -> tuple[set[int], int]:
    """No more faults: the workers work the queue empty and exit. Returns idle-in-transaction pids, wedges."""
    workers.shared.drain.set()
    wedged = 0
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while workers.alive() and not workers.all_wedged() and time.monotonic() < deadline:
        wedged += workers.supervise(restart=True)
        time.sleep(TICK)
    idle_pids = {row[0] for row in injector.query(_IDLE_IN_TRANSACTION)}
    workers.stop()
    return idle_pids, wedged


def run_soak(options: SoakOptions, console: Console) -> Outcome:
    """Run one soak and reconcile it; the cluster and the proxy are removed afterwards."""
    log_dir = options.log_dir or Path(tempfile.mkdtemp(prefix="lockkit-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    faults = schedule(options)
    console.print(_schedule_table(faults, options))
    for fault in faults:
        console.print(f"  t={fault.at:7.2f}s  {fault.kind}", highlight=False)
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        cluster: TempCluster | None = None
        if options.database_url:
            target = _Target.of(options.database_url)
        else:
            cluster = stack.enter_context(TempCluster({"max_connections": "100"}, prefix="lockkit-soak-"))
            target = _Target("127.0.0.1", cluster.port, "postgres", "", "soak")
        proxy = stack.enter_context(FaultProxy(target.upstream()))
        direct = target.url()
        _setup_database(cluster, direct)
        proxied = target.url(host="127.0.0.1", port=proxy.port, sslmode="disable")
        urls = [proxied if i < options.proxied else direct for i in range(options.workers)]
        where = (
            f"cluster on port {cluster.port}" if cluster else f"database {target.describe()} (no restarts)"
        )
        console.print(
            f"{where}, proxy on port {proxy.port}; {options.workers} workers "
            f"({options.proxied} through the proxy); logs in {log_dir}"
        )
        workers = _Workers(options, urls, log_dir)
        injector = Injector(cluster, proxy, workers.kill, options.workers, monitor_url=direct)
        for slot in workers.slots:
            workers.start(slot)
        workers.wait_until_working()
        samples, idle_pids, wedged = _load(options, faults, workers, injector)
        console.print(f"load phase over after {options.duration:.0f}s; draining the job queue")
        idle_after, wedged_in_drain = _drain(workers, injector)
        logs = read_logs(log_dir)
        state = _database_state()
    checks = reconcile(
        logs,
        initial={**SCARCE, **PLENTIFUL},
        wedged=wedged + wedged_in_drain,
        idle_in_transaction=len(idle_pids | idle_after),
        crashes=workers.crashes,
        **state,
    )
    return Outcome(
        checks=checks,
        logs=logs,
        faults=faults,
        injected=dict(injector.done),
        missed=dict(injector.missed),
        cuts={str(action): count for action, count in proxy.cuts.items()},
        throughput={
            "before faults": _rate(samples, 0.0, options.warmup),
            "during faults": _rate(samples, options.warmup, options.duration - options.cooldown),
            "after faults": _rate(samples, options.duration - options.cooldown, options.duration + 1),
        },
        operations=workers.total(),
        seconds=time.monotonic() - began,
        restart_seconds=injector.restart_seconds,
    )


def report(outcome: Outcome, console: Console) -> None:
    """Print the fault counts, throughput and the invariants table."""
    faults = Table(title="Faults injected")
    faults.add_column("fault")
    faults.add_column("scheduled", justify="right")
    faults.add_column("hit", justify="right")
    scheduled: dict[str, int] = defaultdict(int)
    for fault in outcome.faults:
        scheduled[fault.kind] += 1
    for kind in sorted(scheduled):
        faults.add_row(kind, str(scheduled[kind]), str(outcome.injected.get(kind, 0)))
    faults.add_row(
        "COMMIT replies cut (committed / aborted)", "", f"{outcome.cuts['deliver']} / {outcome.cuts['abort']}"
    )
    if outcome.restart_seconds:
        worst = max(outcome.restart_seconds)
        faults.add_row("server restarts: longest (s)", "", f"{worst:.2f}")
    console.print(faults)
    rates = Table(title=f"Throughput ({outcome.operations:,} operations in {outcome.seconds:.0f}s)")
    rates.add_column("phase")
    rates.add_column("operations/s", justify="right")
    for phase, rate in outcome.throughput.items():
        rates.add_row(phase, "-" if rate != rate else f"{rate:,.0f}")
    console.print(rates)
    results = Table(title="Outcomes the workers logged")
    results.add_column("outcome")
    results.add_column("count", justify="right")
    for name, count in sorted(outcome.logs.results.items()):
        results.add_row(name, f"{count:,}")
    for name, count in sorted(outcome.logs.errors.items()):
        results.add_row(f"  failed with {name}", f"{count:,}")
    console.print(results)
    console.print(table(outcome.checks))
