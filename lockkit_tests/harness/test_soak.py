"""The soak's own logic: its schedule, and a reconciliation that does flag each broken invariant.

The soak itself runs in CI (``python -m sample_project soak``, .ci/run); these tests keep its checks honest.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lockkit_harness.cluster import missing_binaries
from lockkit_harness.soak.plan import FAULT_KINDS, SoakOptions, schedule
from lockkit_harness.soak.reconcile import Check, read_logs, reconcile


def test_the_schedule_is_seeded_covers_every_kind_and_stays_inside_the_fault_window() -> None:
    options = SoakOptions(duration=60, fault_every=1.0, seed=3)
    faults = schedule(options)
    assert faults == schedule(options)  # the same seed, the same printed schedule
    assert {fault.kind for fault in faults} == set(FAULT_KINDS)
    assert all(options.warmup <= fault.at < options.duration - options.cooldown for fault in faults)
    assert [fault.at for fault in faults] == sorted(fault.at for fault in faults)


def _write(log_dir: Path, *records: dict[str, object]) -> None:
    lines = [json.dumps(record) for record in records]
    (log_dir / "worker-0.log").write_text("\n".join(lines) + "\n{torn", encoding="utf-8")


def _counts(checks: list[Check]) -> dict[str, int]:
    return {check.name: check.count for check in checks if check.violated}


def test_reconciliation_flags_every_broken_invariant(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {"kind": "order", "ref": "w0.1.1", "sku": "a", "qty": 2, "r": "ok"},  # acknowledged, absent below
        {
            "kind": "order",
            "ref": "w0.1.2",
            "sku": "a",
            "qty": 1,
            "r": "failed",
            "e": "LockTimeout",
        },  # committed
        {"kind": "order", "ref": "w0.1.3", "sku": "a", "qty": 1, "r": "unknown"},  # counted, not a violation
        {"kind": "job", "job": 7, "token": 3, "r": "done"},  # no run with token 3 below
        {"kind": "enqueue", "job": 7, "r": "ok"},
        {"kind": "leak", "lock_timeout": "5s", "statement_timeout": "0"},
        {"kind": "delivered", "ref": "w0.1.9"},  # a callback for an order that never committed
    )
    logs = read_logs(tmp_path)
    checks = reconcile(
        logs,
        initial={"a": 2},
        stock={"a": 0},  # 3 reserved out of 2: oversold by one, and stock != initial - reserved
        reserved={"a": 3},
        ordered={"a": 2},
        order_refs={"w0.1.2", "w0.1.3"},
        runs={7: [2, 4]},
        unfinished_jobs=1,
        wedged=1,
        idle_in_transaction=1,
        crashes=1,
    )
    assert _counts(checks) == {
        "units oversold": 1,
        "SKUs where stock != initial - reserved": 1,
        "SKUs where reservations != audited orders": 1,
        "orders acknowledged but absent": 1,
        "orders reported failed but committed": 1,
        "orders acknowledged whose on_commit callback did not run exactly once": 1,
        "on_commit callbacks run for an order that did not commit": 1,
        "jobs acknowledged done without their run": 1,
        "jobs never completed": 1,
        "jobs whose side effects were applied twice": 1,
        "workers wedged after a fault": 1,
        "leaked lock_timeout/statement_timeout": 1,
        "idle-in-transaction sessions left (> 5 s)": 1,
        "worker crashes (not killed by the soak)": 1,
    }
    unknown = next(check for check in checks if check.name.startswith("orders with an unknown outcome"))
    assert (unknown.count, unknown.violated, unknown.note) == (1, False, "1 had committed")


def test_a_clean_run_violates_nothing(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {"t": 1.0, "kind": "delivered", "ref": "w0.1.1"},
        {"t": 1.1, "kind": "order", "ref": "w0.1.1", "sku": "a", "qty": 2, "r": "ok"},
    )
    checks = reconcile(
        read_logs(tmp_path),
        initial={"a": 5},
        stock={"a": 3},
        reserved={"a": 2},
        ordered={"a": 2},
        order_refs={"w0.1.1"},
        runs={},
        unfinished_jobs=0,
        wedged=0,
        idle_in_transaction=0,
        crashes=0,
    )
    assert not any(check.violated for check in checks)


def _soak(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sample_project", "soak", "--duration", "24", "--workers", "3"]
    command += ["--proxied", "1", "--fault-every", "1.5", "--seed", "5", "--log-dir", str(tmp_path), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize("extra", [(), ("--mutation", "keep-dead-connections")], ids=["plain", "mutation"])
def test_a_soak_too_short_for_any_fault_is_refused_not_reported_as_holding(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    """12 s of load ends before the first fault (5 s warm-up, 8 s cool-down): "invariants hold" would prove
    nothing, and the mutation check would pass with the defect in. Refused before any cluster starts."""
    command = [sys.executable, "-m", "sample_project", "soak", "--duration", "12", "--workers", "3"]
    run = subprocess.run(
        [*command, "--log-dir", str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert "schedules no fault" in run.stderr
    assert "invariants hold" not in run.stdout
    assert list(tmp_path.iterdir()) == []  # no worker ran


@pytest.mark.skipif(missing_binaries() is not None, reason=f"no throwaway cluster: {missing_binaries()}")
def test_the_soak_fails_when_dead_connections_are_never_discarded(tmp_path: Path) -> None:
    """The soak's mutation check: with the turn-2 bug put back, it must report wedged workers and exit 1."""
    run = _soak(tmp_path, "--mutation", "keep-dead-connections")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    wedged = re.search(r"workers wedged after a fault\s*\S\s*(\d+)", run.stdout)
    assert wedged is not None, run.stdout[-3000:]
    assert int(wedged.group(1)) >= 1
    assert "VIOLATED" in run.stdout
    # Every log line carries its wall-clock time.
    lines = [
        json.loads(line)
        for log in tmp_path.glob("worker-*.log")
        for line in log.read_text().splitlines()[:-1]
    ]
    assert lines
    assert all(isinstance(record.get("t"), float) for record in lines)
