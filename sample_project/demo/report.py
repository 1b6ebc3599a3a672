"""The demo's tables (rich): one for the flash sale, one implementation per column; one for the job queue.

Under each table, the code each column runs (file, line, function), and under the sale's, why the throughputs
differ, from the round trips counted after the sale (``roundtrips.py``).
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from sample_project.demo.flash_sale import LABELS, SaleResult
from sample_project.demo.job_queue import LABELS as QUEUE_LABELS
from sample_project.demo.job_queue import QueueResult
from sample_project.demo.roundtrips import COUNT, RoundTrips
from sample_project.demo.workers import queue_implementations, sale_implementations

_ROOT = Path(__file__).resolve().parents[2]  # the checkout: paths are shown relative to it


def code_of(function: Callable[..., Any]) -> str:
    """``path/to/file.py:LINE function``, relative to the checkout, for a function the demo runs."""
    source = Path(inspect.getsourcefile(function) or "?").resolve()
    shown = source.relative_to(_ROOT) if source.is_relative_to(_ROOT) else source
    return f"{shown}:{inspect.getsourcelines(function)[1]} {function.__qualname__}"


def _legend(labels: dict[str, str], code: dict[str, list[str]], implementations: list[str]) -> Text:
    lines = ["The code each column runs:"]
    for name in implementations:
        lines.append(f"  {labels[name]}:")
        lines.extend(f"    {where}" for where in code[name])
    return Text("\n".join(lines))


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
) -> Group:
    """The sale's table; over HTTP (``title`` given) retries happen inside the server and have no row."""
    over_http = title is not None
    functions = sale_implementations()
    code = {name: [code_of(fn)] for name, fn in functions.items()}
    legend = _legend(LABELS, code, [r.implementation for r in results])
    if over_http:
        legend.append(
            "\n(retries happen inside the server, behind POST /inventory/reserve: not counted over HTTP)"
        )
    for result in results:
        if result.implementation == "naive" and result.totals.operations < orders:
            legend.append(
                f"\n(the naive sale placed only the first {result.totals.operations:,} orders, against their own "
                "starting stock: enough to show the race; --naive gives it every order)"
            )
    legend.append(
        "\n(the orders arrive concurrently, in a different order each run: which ones a sold-out SKU refuses, and so"
        " the units reserved, differ slightly between correct columns; stock = initial - reserved holds in each)"
    )
    table = Table(title=title or f"Flash sale: {orders:,} orders, {workers} worker processes, {skus} SKUs")
    table.add_column("")
    for result in results:
        table.add_column(LABELS[result.implementation], justify="right")

    def row(name: str, cells: list[str]) -> None:
        table.add_row(name, *cells)

    row("operations", [f"{r.totals.operations:,}" for r in results])
    row("successes", [f"{r.totals.successes:,}" for r in results])
    row("refusals (sold out)", [f"{r.totals.refusals:,}" for r in results])
    if not over_http:
        row("retries", [f"{r.totals.retries:,}" for r in results])
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
    return Group(table, legend)


def queue_table(results: list[QueueResult]) -> Group:
    """The job queue's table, with the code each column runs."""
    first = results[0]
    code = {name: [code_of(fn) for fn in fns] for name, fns in queue_implementations().items()}
    table = Table(
        title=(
            f"Job queue: {first.audit.jobs:,} jobs, {first.workers} worker processes, one SIGKILLed mid-job"
            + (", one stalled past its lease (lockkit)" if first.workers >= 3 else "")
        ),
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
        [f"{r.totals.reclaimed:,}" if must(r) else "0 (no lease: stays running)" for r in results],
    )
    row("p50 claim latency", [_ms(r.totals.p50_ms) for r in results])
    row("p99 claim latency", [_ms(r.totals.p99_ms) for r in results])
    row("throughput (jobs done)", [_rate(_per_second(r.audit.done, r.totals.seconds)) for r in results])
    row("effects applied twice", [_bad(r.audit.run_twice, must_be_zero=must(r)) for r in results])
    row("jobs lost", [_bad(r.audit.lost, must_be_zero=must(r)) for r in results])
    return Group(table, _legend(QUEUE_LABELS, code, [r.implementation for r in results]))


def _per_second(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.nan


#: The pairs the note compares: lockkit's locked form against the hand-written one (the same decision in Python),
#: then the guarded single statement against the locked form.
COMPARED = (("lockkit", "hand"), ("guarded", "lockkit"))


def throughput_note(
    results: list[SaleResult], trips: Mapping[str, RoundTrips | None], *, workers: int
) -> list[str]:
    """A few lines on why the sale's figures differ, from the audit and the round trips measured after the sale.

    Every sentence is chosen from the figures it cites: a form that holds the row for fewer round trips is said to
    be faster because of it only when its throughput is higher in this run.
    """
    measured = {r.implementation: trips.get(r.implementation) for r in results}
    if not results or any(t is None for t in measured.values()):
        return ["(round trips not counted: libpq tracing is not available with this psycopg)"]
    per = "; ".join(
        f"{LABELS[name]} {t.per_call:g} round trip{'' if t.per_call == 1 else 's'}, "
        f"the row locked during {t.lock_held:g}, "
        f"{t.ms_per_call:.1f} ms, {t.cpu_ms_per_call:.2f} ms of client CPU"
        for name, t in measured.items()
        if t is not None
    )
    lines = [
        f"Per uncontended reservation ({COUNT} each after the sale, round trips from libpq's trace, the row locked "
        f"from the round trip that takes its lock to the one that ends the transaction): {per}."
    ]
    by_name = {r.implementation: r for r in results}
    naive = by_name.get("naive")
    if naive is not None:
        lines.append(_naive_note(naive))
    for name, other in COMPARED:
        first, second = measured.get(name), measured.get(other)
        if first is None or second is None or name not in by_name or other not in by_name:
            continue
        ratio = by_name[name].totals.throughput / by_name[other].totals.throughput
        if math.isnan(ratio):
            continue
        lines.append(
            f"{LABELS[name]}'s throughput is {ratio:.2f}x {LABELS[other]}'s: {_why(name, other, first, second, ratio, workers)}."
        )
    return lines


def _naive_note(naive: SaleResult) -> str:
    audit = naive.audit
    if audit.oversold or audit.lost_updates:
        return (
            f"{LABELS['naive']} ({naive.totals.operations:,} orders) oversold {audit.oversold:,} units and lost "
            f"{audit.lost_updates:,} to overwrites: it reads the count and writes it back without a lock, so two "
            "buyers who read the same count both get units and the second write undoes the first."
        )
    return (
        f"{LABELS['naive']} ({naive.totals.operations:,} orders) happened to oversell nothing this time: it is a "
        "race (no lock between its read and its write), and it loses only when two buyers' reads meet."
    )


def _why(name: str, other: str, first: RoundTrips, second: RoundTrips, ratio: float, workers: int) -> str:
    held = first.lock_held - second.lock_held
    cpu = first.cpu_ms_per_call / second.cpu_ms_per_call if second.cpu_ms_per_call > 0 else math.nan
    cores = os.cpu_count() or "?"
    if abs(held) < 0.05:
        same = f"both hold a hot SKU's row for the same {first.lock_held:g} round trips"
        if abs(cpu - 1) <= 0.1:
            return (
                f"{same} and spend about the same client CPU per reservation ({cpu:.2f}x), so a gap this size "
                "comes from the machine's load during each run, not from the code (run again to see it move)"
            )
        return (
            f"{same}; {LABELS[name]} spends {cpu:.2f}x {LABELS[other]}'s client CPU per reservation, which counts "
            f"when {workers} worker processes share {cores} cores"
        )
    fewer = held < 0
    trips = f"{abs(held):g} round trip{'s' if abs(held) != 1 else ''}"
    lock = (
        f"it holds a hot SKU's row for {trips} {'fewer' if fewer else 'more'} ({first.lock_held:g} vs "
        f"{second.lock_held:g})"
    )
    if (ratio > 1.05) == fewer and abs(ratio - 1) > 0.05:
        return f"{lock}, and reservations of one SKU queue behind that lock"
    # The lock would make it faster (or slower) and this run says otherwise: client CPU, if it points the other
    # way; else the machine's load.
    if (cpu > 1.1) if fewer else (cpu < 0.9):
        return (
            f"{lock}, yet that did not show in this run: it spends {cpu:.2f}x the client CPU per reservation, "
            f"which counts more than the lock when {workers} worker processes share {cores} cores"
        )
    return (
        f"{lock} and spends {cpu:.2f}x the client CPU per reservation, yet that did not show in this run: the "
        "gap comes from the machine's load during each run, not from the code (run again to see it move)"
    )
