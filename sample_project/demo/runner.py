"""Running the whole demo with a progress bar, and checking lockkit's invariants on the results."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import django
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from sample_project.demo.flash_sale import LABELS, SaleResult, run_sale
from sample_project.demo.job_queue import LABELS as QUEUE_LABELS
from sample_project.demo.job_queue import QueueResult, run_queue
from sample_project.demo.orders import NAIVE_ORDERS, ORDERS_FILE, load_orders, sale_of, starting_stock
from sample_project.demo.roundtrips import RoundTrips, measure
from sample_project.demo.workers import sale_implementations

if TYPE_CHECKING:
    from sample_project.demo.task_queue import TaskQueueResult

#: The job queue the demo runs: on Django 6, tasks of ``lockkit.tasks`` run by ``manage.py lockkit_worker``
#: processes; on Django 5.2 (no ``django.tasks``), the worker loop on ``lockkit.claims``.
QUEUE = "tasks" if django.VERSION >= (6, 0) else "lockkit"
TASKS_LABEL = "lockkit.tasks + lockkit_worker"


@dataclass(frozen=True)
class DemoOptions:
    url: str
    workers: int = 4
    orders_file: Path = ORDERS_FILE
    limit: int | None = None
    jobs: int = 400
    stock_ratio: float = 0.6
    #: The sale's implementations, in the table's order: the naive one (wrong on purpose: it shows what the others
    #: prevent), the careful hand-written one, then lockkit's two forms.
    implementations: tuple[str, ...] = ("naive", "hand", "lockkit", "guarded")
    #: The naive sale runs only the first N orders (against their own starting stock): enough to oversell,
    #: briefly. ``None``: all the orders, as the others.
    naive_orders: int | None = NAIVE_ORDERS
    lease: float = 1.5
    #: "naive" and "lockkit" (the claims loop of sample_project/jobs/services.py), "tasks" (Django 6 only).
    queue_implementations: tuple[str, ...] = (QUEUE,)


@dataclass
class DemoResult:
    orders: int
    skus: int
    sales: list[SaleResult] = field(default_factory=list)
    queues: list[QueueResult] = field(default_factory=list)
    #: The job queue on lockkit.tasks (Django 6), when it ran.
    task_queue: TaskQueueResult | None = None
    #: Round trips per uncontended reservation, per implementation (None: libpq could not trace).
    round_trips: dict[str, RoundTrips | None] = field(default_factory=dict)


def broken_invariants(result: DemoResult) -> list[str]:
    """What went wrong where it must not: every sale but the naive one oversells nothing and loses no update;
    the job queue runs every job exactly once, and the killed worker's job was reclaimed."""
    broken: list[str] = []
    for sale in result.sales:
        if sale.implementation == "naive":
            continue  # shown honestly, never required to be right
        name = LABELS[sale.implementation]
        if sale.audit.oversold:
            broken.append(f"{name}: {sale.audit.oversold} units oversold")
        if not sale.audit.consistent:
            broken.append(f"{name}: remaining stock != initial - reserved ({sale.audit})")
        if sale.totals.errors:
            broken.append(f"{name}: {sale.totals.errors} errors, first: {sale.totals.first_error}")
    for queue in result.queues:
        if queue.implementation == "naive":
            continue
        audit = queue.audit
        if audit.run_twice:
            broken.append(f"job queue: effects applied twice: {audit.run_twice}")
        if queue.workers >= 3 and queue.totals.stale < 1:
            broken.append("job queue: the stalled worker's late completion was not refused")
        if audit.lost:
            broken.append(f"job queue: {audit.lost} jobs lost")
        if not queue.killed:
            broken.append("job queue: the victim worker was never killed holding a claim")
        elif queue.totals.reclaimed < 1:
            broken.append("job queue: the killed worker's claim was never reclaimed")
    if result.task_queue is not None:
        from sample_project.demo.task_queue import broken as broken_tasks

        broken += broken_tasks(result.task_queue)
    return broken


def _advance(progress: Progress, task: TaskID, done: int) -> None:
    # The naive job queue completes some jobs twice: the bar counts jobs, not completions.
    total = progress.tasks[task].total
    progress.update(task, completed=min(done, int(total)) if total is not None else done)


def run_demo(options: DemoOptions, console: Console | None = None) -> DemoResult:
    """Run the flash sale once per implementation, count each one's round trips (uncontended, in this process),
    then run the job queue, with a progress bar on ``console``.

    The naive sale places only the first ``options.naive_orders`` orders, against their own starting stock."""
    if options.workers < 2:
        raise ValueError(f"workers must be at least 2, got {options.workers}")
    orders = load_orders(options.orders_file, options.limit)
    stock = starting_stock(orders, options.stock_ratio)
    result = DemoResult(orders=len(orders), skus=len(stock))
    columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console or Console(), transient=False) as progress:
        for implementation in options.implementations:
            placed, starting = sale_of(implementation, orders, options.stock_ratio, options.naive_orders)
            task = progress.add_task(f"flash sale: {LABELS[implementation]}", total=len(placed))
            result.sales.append(
                run_sale(
                    options.url,
                    implementation,
                    placed,
                    starting,
                    workers=options.workers,
                    progress=functools.partial(_advance, progress, task),
                )
            )
        reserve = sale_implementations()
        for implementation in options.implementations:
            result.round_trips[implementation] = measure(reserve[implementation])
        for implementation in options.queue_implementations if options.jobs else ():
            label = TASKS_LABEL if implementation == "tasks" else QUEUE_LABELS[implementation]
            task = progress.add_task(f"job queue: {label}", total=options.jobs)
            if implementation == "tasks":
                from sample_project.demo.task_queue import run_task_queue  # Django 6 only (django.tasks)

                result.task_queue = run_task_queue(
                    options.url,
                    options.jobs,
                    workers=options.workers,
                    progress=functools.partial(_advance, progress, task),
                )
                continue
            result.queues.append(
                run_queue(
                    options.url,
                    implementation,
                    options.jobs,
                    workers=options.workers,
                    lease=options.lease,
                    progress=functools.partial(_advance, progress, task),
                )
            )
    return result
