"""The demo's tables (rich): one for the flash sale, one implementation per column; one for the job queue."""

from __future__ import annotations

import math

from rich.table import Table

from sample_project.demo.flash_sale import LABELS, SaleResult
from sample_project.demo.job_queue import LABELS as QUEUE_LABELS
from sample_project.demo.job_queue import QueueResult


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f} ms"


def _rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}/s"


def _bad(value: int, *, must_be_zero: bool) -> str:
    if value == 0:
        return "[green]0[/green]"
    return f"[bold red]{value:,}[/bold red]" if must_be_zero else f"[yellow]{value:,}[/yellow]"


def sale_table(
    results: list[SaleResult], *, orders: int, workers: int, skus: int, title: str | None = None
) -> Table:
    """Retries happen inside the server in the HTTP sale and are not counted there (shown as "n/a")."""
    table = Table(title=title or f"Flash sale: {orders:,} orders, {workers} worker processes, {skus} SKUs")
    over_http = title is not None
    table.add_column("")
    for result in results:
        table.add_column(LABELS[result.implementation], justify="right")

    def row(name: str, cells: list[str]) -> None:
        table.add_row(name, *cells)

    row("operations", [f"{r.totals.operations:,}" for r in results])
    row("successes", [f"{r.totals.successes:,}" for r in results])
    row("refusals (sold out)", [f"{r.totals.refusals:,}" for r in results])
    row("retries", ["n/a (in server)" if over_http else f"{r.totals.retries:,}" for r in results])
    row(
        "lock timeouts (HTTP 503)" if over_http else "lock timeouts",
        [f"{r.totals.lock_timeouts:,}" for r in results],
    )
    row("errors", [_bad(r.totals.errors, must_be_zero=True) for r in results])
    row("p50 latency", [_ms(r.totals.p50_ms) for r in results])
    row("p99 latency", [_ms(r.totals.p99_ms) for r in results])
    row("throughput", [_rate(r.totals.throughput) for r in results])
    row("units reserved", [f"{r.audit.reserved:,} of {r.audit.initial:,}" for r in results])
    row("units oversold", [_bad(r.audit.oversold, must_be_zero=r.implementation != "naive") for r in results])
    row(
        "units lost to overwrites",
        [_bad(r.audit.lost_updates, must_be_zero=r.implementation != "naive") for r in results],
    )
    row(
        "stock = initial - reserved",
        ["[green]yes[/green]" if r.audit.consistent else "[red]no[/red]" for r in results],
    )
    row("jobs run twice / lost", ["n/a" for _ in results])
    return table


def queue_table(results: list[QueueResult]) -> Table:
    first = results[0]
    table = Table(
        title=(
            f"Job queue: {first.audit.jobs:,} jobs, {first.workers} worker processes, one SIGKILLed mid-job"
            + (", one stalled past its lease (lockkit)" if first.workers >= 3 else "")
        )
    )
    table.add_column("")
    for result in results:
        table.add_column(QUEUE_LABELS[result.implementation], justify="right")

    def row(name: str, cells: list[str]) -> None:
        table.add_row(name, *cells)

    def must(result: QueueResult) -> bool:
        return result.implementation != "naive"

    row("operations (claims)", [f"{r.totals.operations:,}" for r in results])
    row("successes (completions)", [f"{r.totals.successes:,}" for r in results])
    row("jobs done", [f"{r.audit.done:,} of {r.audit.jobs:,}" for r in results])
    row("refusals (stale completions fenced)", [f"{r.totals.stale:,}" for r in results])
    row("retries", [f"{r.totals.retries:,}" for r in results])
    row("lock timeouts", [f"{r.totals.lock_timeouts:,}" for r in results])
    row("worker killed holding a claim", ["yes" if r.killed else "[red]no[/red]" for r in results])
    row(
        f"reclaimed after the {first.lease:g}s lease",
        [f"{r.totals.reclaimed:,}" if must(r) else "n/a (no lease)" for r in results],
    )
    row("p50 claim latency", [_ms(r.totals.p50_ms) for r in results])
    row("p99 claim latency", [_ms(r.totals.p99_ms) for r in results])
    row("throughput (jobs done)", [_rate(_per_second(r.audit.done, r.totals.seconds)) for r in results])
    row("units oversold", ["n/a" for _ in results])
    row("effects applied twice", [_bad(r.audit.run_twice, must_be_zero=must(r)) for r in results])
    row("jobs lost", [_bad(r.audit.lost, must_be_zero=must(r)) for r in results])
    return table


def _per_second(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.nan
