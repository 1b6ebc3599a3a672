"""Tasks per second of ``lockkit_worker``, django-tasks' ``db_worker`` and Celery, same trivial task; and enqueues.

For each measurement: W worker processes are started and warmed up (they run 20 tasks each first), then N tasks
are enqueued in one transaction, all due (``run_after``) at one instant shortly after; the clock runs from that
instant until every task is recorded as finished (polled every 10 ms from this process). Workers are stopped with
SIGTERM after each measurement. ``--rounds`` repeats every configuration, alternating which worker goes first from
round to round (the machine's load drifts), and reports the median with the min-max over rounds, and lockkit's
ratio to django-tasks and to Celery within each round. django-tasks' rows are left out, with a note, when
``django_tasks_db`` is not installed, Celery's when ``celery`` is not installed or its Redis broker
(``--celery-broker``) does not answer. Celery workers are one process each too (``-P solo``, ``acks_late``, prefetch
1, no result backend); their tasks are enqueued while the workers' consumers are cancelled, and the clock starts when
they are added back. Before the workers, ``enqueue()`` is timed against a plain ORM insert of the same row (one
transaction of ``--tasks`` each, alternating which goes first).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# Seconds between the end of enqueueing and the moment the timed tasks become due.
START_DELAY = 1.0


@dataclass(frozen=True)
class Row:
    worker: str
    processes: int
    batch: int
    tasks: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds


# The workers' sessions commit with synchronous_commit = off unless --synchronous-commit server (as the main suite
# does, through PGOPTIONS, for both workers alike): with the server's "on" every commit waits for a WAL flush on
# this VM's disk and both workers measure the disk, not their own cost per task.
SYNCHRONOUS_COMMIT = {"off": "-c synchronous_commit=off", "server": ""}
_pgoptions = SYNCHRONOUS_COMMIT["off"]


def _environment(url: str) -> dict[str, str]:
    options = " ".join(part for part in (os.environ.get("PGOPTIONS", ""), _pgoptions) if part)
    return {
        **os.environ,
        "PGOPTIONS": options,
        "DJANGO_SETTINGS_MODULE": "benchmarks.tasks.settings",
        "LOCKKIT_BENCH_DATABASE_URL": url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def _command(worker: str, batch: int) -> list[str]:
    from benchmarks.tasks.settings import POLL

    if worker == "celery":
        from benchmarks.tasks.celery_app import QUEUE

        return ["celery", "-A", "benchmarks.tasks.celery_app", "worker", "-P", "solo", "-c", "1", "-Q", QUEUE,
                "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"]  # fmt: skip
    if worker == "lockkit":
        return ["lockkit_worker", "--claim-batch", str(batch), "--concurrency", "1", "--verbosity", "0"]
    return ["db_worker", "--backend", "django_tasks_db", "--interval", str(POLL), "--no-startup-delay"]


# The task table of each worker (django-tasks-db's app label is "django_tasks_database").
MODELS = {"lockkit": "lockkit_tasks.QueuedTask", "django_tasks_db": "django_tasks_database.DBTaskResult"}


def _model(worker: str) -> Any:
    from django.apps import apps

    label = MODELS[worker]  # a variable, not a literal: the optional app is unknown to the type checker
    return apps.get_model(label)


def _finished(worker: str) -> int:
    return int(_model(worker).objects.filter(status__in=["SUCCESSFUL", "FAILED"]).count())


def _clear(worker: str) -> None:
    """Empty the worker's task table with ``TRUNCATE``: no dead rows from earlier measurements.

    A server with autovacuum off (this VM's) would otherwise keep every row each measurement updated or deleted,
    and every later claim would step over them; production runs autovacuum.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {connection.ops.quote_name(_model(worker)._meta.db_table)}")


def _analyze(worker: str) -> None:
    """``ANALYZE`` the worker's task table once its tasks are enqueued, as autovacuum would after such a burst.

    Without it the planner sees the empty table of the ``TRUNCATE`` and may plan each claim for a handful of rows.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(_model(worker)._meta.db_table)}")


def _enqueue(worker: str, count: int, run_after: datetime | None = None) -> None:
    from django.db import transaction

    from benchmarks.tasks import jobs

    chosen: Any = jobs.trivial_lockkit if worker == "lockkit" else jobs.trivial_django_tasks_db
    if run_after is not None:
        chosen = chosen.using(run_after=run_after)
    with transaction.atomic():
        for _ in range(count):
            chosen.enqueue()


def _wait_for(worker: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _finished(worker) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{worker}: {_finished(worker)} of {count} tasks finished in {timeout:g}s")
        time.sleep(0.01)


def _celery_pending() -> int:
    """Messages of the benchmark's queue not yet acknowledged: waiting in the list, or delivered and unacked."""
    from benchmarks.tasks.celery_app import QUEUE, app

    with app.connection_for_write() as connection:
        client = connection.default_channel.client
        return int(client.llen(QUEUE)) + int(client.hlen("unacked"))


def _celery_drain(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _celery_pending():
        if time.monotonic() > deadline:
            raise RuntimeError(f"celery: {_celery_pending()} tasks left after {timeout:g}s")
        time.sleep(0.01)


def _celery_measure(processes: int, tasks: int) -> float:
    """Seconds for ``tasks`` Celery tasks: enqueued while the consumers are cancelled, timed from adding them back."""
    from benchmarks.tasks.celery_app import QUEUE, app, trivial

    app.control.purge()  # nothing left over from an earlier run
    deadline = time.monotonic() + 60
    while len(app.control.ping(timeout=0.5)) < processes:  # every worker up before the warm-up
        if time.monotonic() > deadline:
            raise RuntimeError("celery: the workers did not answer a ping within 60s")
    for _ in range(20 * processes):
        trivial.delay()
    _celery_drain(120)
    replies = app.control.cancel_consumer(QUEUE, reply=True, timeout=5)
    if len(replies) < processes:
        raise RuntimeError(f"celery: {len(replies)} of {processes} workers cancelled their consumer")
    with app.producer_or_acquire() as producer:
        for _ in range(tasks):
            trivial.apply_async(producer=producer)
    began = time.monotonic()
    app.control.add_consumer(QUEUE, reply=False)
    _celery_drain(600)
    return time.monotonic() - began


def measure(url: str, worker: str, processes: int, batch: int, tasks: int) -> Row:
    """One row: start the workers, warm them up, time ``tasks`` tasks, stop them."""
    if worker != "celery":
        _clear(worker)
    # Celery's command runs as "python -m celery ...", the others as "python -m django <command>".
    module = [] if worker == "celery" else ["django"]
    started = [
        subprocess.Popen(
            [sys.executable, "-m", *module, *_command(worker, batch)],
            env=_environment(url),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]
    try:
        if worker == "celery":
            return Row(worker, processes, batch, tasks, _celery_measure(processes, tasks))
        warm = 20 * processes
        _enqueue(worker, warm)
        _wait_for(worker, warm, timeout=120)
        # Enqueued ahead, due at one instant: the clock starts then (enqueueing is not what is measured).
        due = datetime.now(UTC) + timedelta(seconds=START_DELAY + tasks / 500)
        _enqueue(worker, tasks, run_after=due)
        _analyze(worker)
        _wait_for(worker, warm + tasks, timeout=600)
        seconds = (datetime.now(UTC) - due).total_seconds()
    finally:
        for process in started:
            process.send_signal(signal.SIGTERM)
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
    return Row(worker, processes, batch, tasks, seconds)


def _label(worker: str, batch: int) -> str:
    if worker == "celery":
        return "Celery (Redis, acks_late, prefetch 1)"
    return f"lockkit_worker --claim-batch {batch}" if worker == "lockkit" else "django-tasks db_worker"


def _spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}\u2013{max(values):{fmt}})"


def table(rows: list[Row], note: str) -> str:
    """Median (min-max) tasks/s per configuration over rounds, and lockkit/django-tasks ratios per round."""
    configs: dict[tuple[str, int, int], list[Row]] = {}
    for row in rows:
        configs.setdefault((row.worker, row.processes, row.batch), []).append(row)
    lines = [
        "| worker | processes | tasks | rounds | tasks/s: median (min\u2013max) |",
        "|---|---:|---:|---:|---:|",
    ]
    for (worker, processes, batch), found in configs.items():
        rates = [row.rate for row in found]
        lines.append(
            f"| {_label(worker, batch)} | {processes} | {found[0].tasks} | {len(found)} | {_spread(rates, ',.0f')} |"
        )
    ratios: list[str] = []
    for other, name in (("django_tasks_db", "db_worker"), ("celery", "Celery")):
        for (worker, processes, batch), found in configs.items():
            theirs = configs.get((other, processes, 1))
            if worker != "lockkit" or not theirs or len(theirs) != len(found):
                continue
            per_round = [mine.rate / them.rate for mine, them in zip(found, theirs, strict=True)]
            ratios.append(f"| {_label(worker, batch)} / {name} | {processes} | {_spread(per_round, '.2f')} |")
    if ratios:
        lines += [
            "",
            "| ratio (within each round) | processes | median (min\u2013max) |",
            "|---|---:|---:|",
            *ratios,
        ]
    return "\n".join(lines) + (f"\n\n{note}" if note else "")


def _load() -> str:
    try:
        return ", ".join(f"{value:.1f}" for value in os.getloadavg())
    except OSError:  # pragma: no cover - no load average on this platform
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tasks", description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("LOCKKIT_BENCH_DATABASE_URL", ""))
    parser.add_argument("--tasks", type=int, default=2000, help="tasks timed per measurement (default 2000)")
    parser.add_argument("--workers", default="1,2,4", help="worker process counts (default 1,2,4)")
    parser.add_argument(
        "--batch", type=int, default=50, help="lockkit's --claim-batch for the batch rows (default 50)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every configuration (default 3)")
    parser.add_argument(
        "--quick", action="store_true", help="200 tasks, 1 and 2 workers, 1 round: a smoke run"
    )
    parser.add_argument(
        "--celery-broker", default="redis://127.0.0.1:6379/15", help="Celery's Redis broker (default db 15)"
    )
    parser.add_argument(
        "--synchronous-commit",
        choices=sorted(SYNCHRONOUS_COMMIT),
        default="off",
        help="the workers' synchronous_commit: off (default, as the main suite) or the server's own setting",
    )
    parser.add_argument(
        "--rtt",
        type=float,
        default=0.0,
        metavar="MS",
        help="put PostgreSQL behind a latency relay adding MS milliseconds of round trip (calibrated, as the main "
        "suite's --rtt), and Celery's Redis broker behind a relay of the same delay; default 0: loopback",
    )
    parser.add_argument(
        "--wakeup-samples",
        type=int,
        default=30,
        help="tasks enqueued one by one to an idle worker, per worker and round, for the wake-up table (default 30)",
    )
    options = parser.parse_args(argv)
    global _pgoptions
    _pgoptions = SYNCHRONOUS_COMMIT[options.synchronous_commit]
    if options.rounds < 1:
        parser.error("--rounds must be at least 1")
    import django

    if django.VERSION < (6, 0):
        print(f"python -m benchmarks.tasks needs Django 6 (django.tasks); this is {django.get_version()}")
        return 2
    from benchmarks.dbserver import target

    server = target(options.database_url or None)
    broker, network_line = options.celery_broker, "loopback (no relay)"
    if options.rtt < 0:
        parser.error("--rtt must be 0 or more milliseconds")
    if options.rtt > 0:
        server, broker, network_line = _behind_relays(server, broker, options.rtt)
    url = server.url
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "benchmarks.tasks.settings",
            "LOCKKIT_BENCH_DATABASE_URL": url,
            "LOCKKIT_BENCH_CELERY_BROKER": broker,
        }
    )
    from django.core.management import call_command

    django.setup()
    from benchmarks.tasks.settings import DJANGO_TASKS_DB

    call_command("migrate", verbosity=0)
    counts = [1, 2] if options.quick else [int(n) for n in options.workers.split(",")]
    tasks = 200 if options.quick else options.tasks
    rounds = 1 if options.quick else options.rounds
    single = [("lockkit", 1), ("django_tasks_db", 1)] if DJANGO_TASKS_DB else [("lockkit", 1)]
    notes = [] if DJANGO_TASKS_DB else ["django-tasks' rows skipped: django-tasks-db is not installed."]
    celery_missing = _celery_missing()
    if celery_missing:
        notes.append(f"Celery's rows skipped: {celery_missing}.")
    else:
        single.append(("celery", 1))
    note = " ".join(notes)
    rows: list[Row] = []
    began, load_before = datetime.now(UTC), _load()
    from benchmarks.tasks import enqueue

    inserts = enqueue.measure(rounds, tasks, lambda: _clear("lockkit"))
    from benchmarks.tasks import wakeup

    idle = ["lockkit", "django_tasks_db"] if DJANGO_TASKS_DB else ["lockkit"]
    wakeups: dict[str, list[list[float]]] = {worker: [] for worker in idle}
    samples = 10 if options.quick else options.wakeup_samples
    for number in range(rounds):
        for worker in idle if number % 2 == 0 else idle[::-1]:
            wakeups[worker].append(wakeup.measure(url, worker, samples))
    for number in range(rounds):
        # Alternate which worker goes first, round by round; the batch rows come last.
        order = single if number % 2 == 0 else single[::-1]
        for processes in counts:
            for worker, batch in [*order, ("lockkit", options.batch)]:
                rows.append(measure(url, worker, processes, batch, tasks))
                print(f"round {number + 1}: {rows[-1]} {rows[-1].rate:.0f}/s", file=sys.stderr, flush=True)
    rows.sort(
        key=lambda row: (row.worker != "lockkit" or row.batch != 1, row.worker != "lockkit", row.processes)
    )
    print(f"Measured {began:%Y-%m-%d %H:%M}\u2013{datetime.now(UTC):%H:%M} UTC, Python {sys.version.split()[0]}, "
          f"Django {django.get_version()}, {os.cpu_count()} CPUs, synchronous_commit "
          f"{options.synchronous_commit} for the workers, load average (1, 5, 15 min) before "
          f"{load_before}, after {_load()}; network: {network_line}.\n")  # fmt: skip
    print(table(rows, note))
    print("\n" + enqueue.table(inserts, tasks))
    print("\n" + wakeup.table(wakeups))
    return 0


def _behind_relays(server: Any, broker: str, rtt_ms: float) -> tuple[Any, str, str]:
    """PostgreSQL behind a calibrated relay adding ``rtt_ms``, Redis behind one of the same delay; closed at exit."""
    import atexit
    from urllib.parse import urlsplit

    from benchmarks.network import through_relay
    from lockkit_harness.latency import LatencyRelay

    relayed, relay, figures = through_relay(server, rtt_ms)
    atexit.register(relay.close)
    parts = urlsplit(broker)
    redis_relay = LatencyRelay(
        parts.hostname or "127.0.0.1", parts.port or 6379, figures["relay_delay_ms"] / 1000
    )
    atexit.register(redis_relay.close)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + f"127.0.0.1:{redis_relay.port}"
    line = (
        f"latency relay, {rtt_ms:g} ms of round trip asked (relay delay {figures['relay_delay_ms']} ms): SELECT 1 "
        f"median {figures['measured']['median_ms']:.3f} ms through it, {figures['loopback']['median_ms']:.3f} ms on "
        f"loopback; Celery's Redis broker behind a relay of the same delay"
    )
    return relayed, parts._replace(netloc=netloc).geturl(), line


def _celery_missing() -> str:
    """Why Celery cannot be measured here ("" when it can): not installed, or its broker does not answer."""
    from importlib.util import find_spec

    if find_spec("celery") is None:
        return "celery is not installed (the bench extra)"
    from benchmarks.tasks.celery_app import app

    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1)
            connection.default_channel.client.ping()
    except Exception as failure:  # any transport error: the broker is not there
        return f"its broker {os.environ['LOCKKIT_BENCH_CELERY_BROKER']} does not answer ({failure})"
    return ""
