"""Reconciling the workers' logs against the database after a soak, and the table of invariants (rich)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table


@dataclass(frozen=True)
class Check:
    """One line of the result table: a count, and whether it must be zero."""

    name: str
    count: int
    must_be_zero: bool
    note: str = ""

    @property
    def violated(self) -> bool:
        return self.must_be_zero and self.count != 0


@dataclass
class Logs:
    """What the workers' logs say happened."""

    orders: dict[str, dict[str, Any]] = field(default_factory=dict)  # ref -> last record
    jobs_done: list[tuple[int, int]] = field(default_factory=list)  # (job, token) acknowledged done
    results: Counter[str] = field(default_factory=Counter)  # "order ok", "job stale", ...
    errors: Counter[str] = field(default_factory=Counter)  # exception names of failed operations
    leaks: int = 0
    enqueued: int = 0
    delivered: Counter[str] = field(default_factory=Counter)  # order ref -> on_commit callbacks run


def read_logs(log_dir: Path) -> Logs:
    """Read every ``worker-*.log``; a torn last line (a SIGKILL mid-write) is ignored."""
    logs = Logs()
    for path in sorted(log_dir.glob("worker-*.log")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind, result = record.get("kind"), record.get("r")
            if result is not None:
                logs.results[f"{kind} {result}"] += 1
            if result == "failed":
                logs.errors[f"{kind}: {record.get('e')}"] += 1
            if kind == "order":
                logs.orders[record["ref"]] = record
            elif kind == "job" and result == "done":
                logs.jobs_done.append((int(record["job"]), int(record["token"])))
            elif kind == "enqueue" and result == "ok":
                logs.enqueued += 1
            elif kind == "delivered":
                logs.delivered[record["ref"]] += 1
            elif kind == "leak":
                logs.leaks += 1
    return logs


def reconcile(
    logs: Logs,
    *,
    initial: dict[str, int],
    stock: dict[str, int],
    reserved: dict[str, int],
    ordered: dict[str, int],
    order_refs: set[str],
    runs: dict[int, list[int]],
    unfinished_jobs: int,
    wedged: int,
    idle_in_transaction: int,
    crashes: int,
) -> list[Check]:
    """Compare what was acknowledged with what the database holds; one ``Check`` per invariant."""
    oversold = sum(max(0, reserved.get(sku, 0) - units) for sku, units in initial.items())
    stock_off = sum(1 for sku, units in initial.items() if stock.get(sku) != units - reserved.get(sku, 0))
    audit_off = sum(1 for sku in initial if reserved.get(sku, 0) != ordered.get(sku, 0))
    acked = {ref for ref, rec in logs.orders.items() if rec["r"] == "ok"}
    refused_or_failed = {ref for ref, rec in logs.orders.items() if rec["r"] in ("refused", "failed")}
    unknown = {ref for ref, rec in logs.orders.items() if rec["r"] == "unknown"}
    done_without_run = sum(1 for job, token in logs.jobs_done if token not in runs.get(job, []))
    not_delivered_once = sum(1 for ref in acked if logs.delivered[ref] != 1)
    delivered_uncommitted = sum(1 for ref in logs.delivered if ref not in order_refs)
    twice = sum(1 for tokens in runs.values() if len(tokens) > 1)
    return [
        Check("units oversold", oversold, True),
        Check("SKUs where stock != initial - reserved", stock_off, True),
        Check("SKUs where reservations != audited orders", audit_off, True),
        Check(
            "orders acknowledged but absent", len(acked - order_refs), True, f"of {len(acked):,} acknowledged"
        ),
        Check(
            "orders reported failed but committed",
            len(refused_or_failed & order_refs),
            True,
            f"of {len(refused_or_failed):,} refused or failed",
        ),
        Check(
            "orders with an unknown outcome (CommitOutcomeUnknown)",
            len(unknown),
            False,
            f"{len(unknown & order_refs)} had committed",
        ),
        Check(
            "orders acknowledged whose on_commit callback did not run exactly once",
            not_delivered_once,
            True,
            f"of {len(acked):,} acknowledged",
        ),
        Check("on_commit callbacks run for an order that did not commit", delivered_uncommitted, True),
        Check(
            "jobs acknowledged done without their run", done_without_run, True, f"of {len(logs.jobs_done):,}"
        ),
        Check("jobs never completed", unfinished_jobs, True, f"of {logs.enqueued:,} enqueued"),
        Check("jobs whose side effects were applied twice", twice, True),
        Check("workers wedged after a fault", wedged, True),
        Check("leaked lock_timeout/statement_timeout", logs.leaks, True),
        Check("idle-in-transaction sessions left (> 5 s)", idle_in_transaction, True),
        Check("worker crashes (not killed by the soak)", crashes, True),
    ]


def table(checks: list[Check]) -> Table:
    """The invariants as a rich table: red when one that must be zero is not."""
    result = Table(title="Soak: invariants, reconciled against the database")
    result.add_column("invariant")
    result.add_column("count", justify="right")
    result.add_column("", justify="left")
    result.add_column("note")
    for check in checks:
        if check.violated:
            verdict, count = "[bold red]VIOLATED[/bold red]", f"[bold red]{check.count:,}[/bold red]"
        elif check.must_be_zero:
            verdict, count = "[green]ok[/green]", f"[green]{check.count:,}[/green]"
        else:
            verdict, count = "[yellow]counted[/yellow]", f"{check.count:,}"
        result.add_row(check.name, count, verdict, check.note)
    return result
