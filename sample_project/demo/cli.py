"""``python -m sample_project``: ``demo`` (the contention demo), ``serve`` (gunicorn), ``manage`` (Django),
``soak`` (the services under faults, reconciled).

``demo``, ``serve`` and ``manage`` take ``--database-url`` (a PostgreSQL URL; default ``$SAMPLE_DATABASE_URL``,
else an embedded PostgreSQL started here, before Django reads the settings, and removed afterwards). The sample's
tables are created with ``migrate``. ``soak`` always starts a throwaway PostgreSQL cluster of its own, which it
restarts on purpose. The embedded server and the soak are the development harness's (``lockkit_harness``). This is the demo harness's entry point; the project a user would copy is ``manage.py`` with
``sample_project/settings.py``, ``urls.py``, ``wsgi.py`` and the ``inventory`` and ``jobs`` apps.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from lockkit_harness import embedded
from sample_project.demo.bootstrap import DATABASE_URL_ENV, SETTINGS_MODULE
from sample_project.demo.orders import NAIVE_ORDERS

HTTP_DEFAULT_ORDERS = 3_000


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _check_demo_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad demo options before a database is started (argparse exits with status 2)."""
    from sample_project.demo.orders import ORDERS_FILE, load_orders  # no models: Django is not set up yet

    if args.workers < 2:
        parser.error("--workers must be at least 2")
    if args.jobs < 0:
        parser.error("--jobs must be 0 or more")
    try:
        load_orders(args.orders or ORDERS_FILE, args.limit)
    except (OSError, ValueError) as exc:
        parser.error(f"--orders: {exc}")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--database-url",
        help=f"PostgreSQL URL (default ${DATABASE_URL_ENV}, else an embedded server for this run)",
    )
    parser = argparse.ArgumentParser(prog="python -m sample_project", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo", parents=[common], help="run the flash sale and the job queue under contention"
    )
    demo.add_argument(
        "--workers", type=_positive_int, default=4, help="worker processes (default 4, at least 2)"
    )
    demo.add_argument(
        "--orders", type=Path, help="orders file, CSV 'sku,quantity' (default: the bundled 10,000)"
    )
    demo.add_argument("--limit", type=_positive_int, help="use only the first N orders")
    demo.add_argument("--jobs", type=int, default=400, help="jobs in the job queue (default 400; 0 skips it)")
    demo.add_argument(
        "--stock-ratio",
        type=_positive_float,
        default=0.6,
        help="starting stock as a share of the units ordered (0.6)",
    )
    demo.add_argument(
        "--naive",
        action="store_true",
        help="run the naive read-then-write sale on every order, not only the first "
        f"{NAIVE_ORDERS:,}, and add the naive job queue (wrong on purpose: oversold units, jobs lost "
        "or run twice)",
    )
    # The guarded UPDATE is compared by default now; the old flag is accepted and changes nothing.
    demo.add_argument("--guarded", action="store_true", help=argparse.SUPPRESS)
    demo.add_argument(
        "--http", action="store_true", help="drive the flash sale through gunicorn and HTTP clients instead"
    )

    serve = commands.add_parser("serve", parents=[common], help="serve the JSON endpoints with gunicorn")
    serve.add_argument("--bind", default="127.0.0.1:8000")
    serve.add_argument("--workers", type=_positive_int, default=3)

    manage = commands.add_parser("manage", parents=[common], help="run a Django management command")
    manage.add_argument("args", nargs=argparse.REMAINDER)

    soak = commands.add_parser(
        "soak", help="run the services under faults on a throwaway cluster and reconcile the outcomes"
    )
    soak.add_argument("--duration", type=_positive_float, default=120.0, help="seconds of load (default 120)")
    soak.add_argument("--workers", type=_positive_int, default=8, help="worker processes (default 8)")
    soak.add_argument(
        "--proxied", type=int, default=3, help="workers reaching the server through the proxy (default 3)"
    )
    soak.add_argument(
        "--fault-every", type=_positive_float, default=2.0, help="mean seconds between faults (default 2)"
    )
    soak.add_argument("--seed", type=int, default=11, help="random seed of the schedule (default 11)")
    soak.add_argument("--log-dir", type=Path, help="where the per-worker logs go (default a temporary dir)")
    soak.add_argument(
        "--database-url",
        help="soak this PostgreSQL database (postgres://user@host:port/dbname) instead of a throwaway cluster: its "
        "public schema is DROPPED and recreated, and the server is never restarted (no restart faults)",
    )
    soak.add_argument(
        "--mutation",
        choices=("keep-dead-connections",),  # lockkit_harness.soak.worker.MUTATIONS
        help="put a known defect into the workers' lockkit (the soak's own test: the run must then fail)",
    )
    return parser


def _setup(parser: argparse.ArgumentParser, database_url: str | None) -> str:
    if database_url:
        scheme = database_url.split(":", 1)[0].lower()
        if scheme not in {"postgres", "postgresql", "pgsql"}:
            parser.error(f"--database-url must be a PostgreSQL URL (postgres://...), got a {scheme!r} URL")
        os.environ[DATABASE_URL_ENV] = database_url
    embedded.database_url(DATABASE_URL_ENV)  # an embedded server when no URL is set; its URL is exported
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import OperationalError

    try:
        call_command("migrate", verbosity=0)
    except (
        OperationalError
    ) as exc:  # the server is unreachable or the database does not exist: say so briefly
        first_line = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        parser.exit(1, f"python -m sample_project: cannot use the database: {first_line}\n")
    return os.environ[DATABASE_URL_ENV]


def _demo(args: argparse.Namespace, url: str) -> int:
    from rich.console import Console

    from sample_project.demo.orders import ORDERS_FILE
    from sample_project.demo.report import queue_table, sale_table, throughput_note
    from sample_project.demo.runner import QUEUE, DemoOptions, broken_invariants, run_demo

    options = DemoOptions(
        url=url,
        workers=args.workers,
        orders_file=args.orders or ORDERS_FILE,
        limit=args.limit,
        jobs=args.jobs,
        stock_ratio=args.stock_ratio,
        naive_orders=None if args.naive else NAIVE_ORDERS,
        queue_implementations=("naive", QUEUE) if args.naive else (QUEUE,),
    )
    console = Console(width=max(Console().width, 100))  # four sale columns; read in CI logs and in the docs
    started = time.monotonic()
    if args.http:
        from sample_project.demo.http_sale import run_http_demo

        if args.limit is None:
            options = dataclasses.replace(options, limit=HTTP_DEFAULT_ORDERS)
            console.print(f"HTTP mode: the first {HTTP_DEFAULT_ORDERS:,} orders (--limit to change)")
        status: int = run_http_demo(options, console)
        if args.jobs:
            console.print("(HTTP mode runs the flash sale only; the job queue runs without --http)")
        verdict = (
            "[bold red]FAILED[/bold red]" if status else "[bold green]lockkit invariants hold[/bold green]"
        )
        console.print(f"{verdict} ({time.monotonic() - started:.1f}s)")
        return status
    result = run_demo(options, console)
    console.print(sale_table(result.sales, orders=result.orders, workers=options.workers, skus=result.skus))
    for line in throughput_note(result.sales, result.round_trips, workers=options.workers):
        console.print(line, soft_wrap=True)
    if result.queues:
        console.print(queue_table(result.queues))
    if result.task_queue is not None:
        from sample_project.demo.task_report import task_queue_table

        console.print(task_queue_table(result.task_queue))
    elif args.jobs and QUEUE == "lockkit":
        import django

        console.print(
            f"(The job queue ran on lockkit.claims: lockkit.tasks and manage.py lockkit_worker need Django 6's "
            f"django.tasks; this is Django {django.get_version()}.)",
            soft_wrap=True,
        )
    broken = broken_invariants(result)
    for problem in broken:
        console.print(f"[bold red]lockkit invariant broken:[/bold red] {problem}")
    verdict = "[bold red]FAILED[/bold red]" if broken else "[bold green]lockkit invariants hold[/bold green]"
    console.print(f"{verdict} ({time.monotonic() - started:.1f}s)")
    return 1 if broken else 0


def _serve(args: argparse.Namespace) -> int:
    from gunicorn.app.wsgiapp import run

    sys.argv = ["gunicorn", "--bind", args.bind, "--workers", str(args.workers), "sample_project.wsgi"]
    run()
    return 0


def _soak(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from rich.console import Console

    from lockkit_harness.cluster import missing_binaries
    from lockkit_harness.soak.plan import SoakOptions, schedule
    from lockkit_harness.soak.runner import report, run_soak

    if not 0 <= args.proxied <= args.workers:
        parser.error("--proxied must be between 0 and --workers")
    if args.database_url and args.database_url.split(":", 1)[0].lower() not in {"postgres", "postgresql"}:
        parser.error("--database-url must be a PostgreSQL URL (postgres://user@host:port/dbname)")
    missing = None if args.database_url else missing_binaries()
    if missing is not None:
        parser.exit(1, f"python -m sample_project soak: cannot start a cluster: {missing}\n")
    options = SoakOptions(
        duration=args.duration,
        workers=args.workers,
        proxied=args.proxied,
        fault_every=args.fault_every,
        seed=args.seed,
        log_dir=args.log_dir,
        database_url=args.database_url,
        mutation=args.mutation,
    )
    if not schedule(options):
        # A run without a fault reconciles nothing a fault could break: "invariants hold" would prove nothing,
        # and a --mutation run (the soak's own test) would pass with the defect in.
        parser.error(
            f"--duration {args.duration:g} with --fault-every {args.fault_every:g} schedules no fault (faults come "
            f"after a {options.warmup:g} s warm-up and stop {options.cooldown:g} s before the end): nothing would "
            "be tested; run longer or with more frequent faults"
        )
    console = Console(width=max(Console().width, 110))  # the tables are read in CI logs and in the docs
    outcome = run_soak(options, console)
    report(outcome, console)
    verdict = (
        "[bold red]FAILED[/bold red]" if outcome.exit_code else "[bold green]invariants hold[/bold green]"
    )
    console.print(f"{verdict} ({outcome.seconds:.0f}s)")
    return outcome.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "soak":
        return _soak(parser, args)
    if args.command == "demo":
        _check_demo_args(parser, args)
    url = _setup(parser, args.database_url)
    if args.command == "demo":
        return _demo(args, url)
    if args.command == "serve":
        return _serve(args)
    from django.core.management import execute_from_command_line

    execute_from_command_line(["python -m sample_project manage", *args.args])
    return 0
