"""The soak's own logic: its schedule, and a reconciliation that does flag each broken invariant.

The soak itself runs in CI (``python -m sample_project soak``, .ci/run); these tests keep its checks honest.
"""

from __future__ import annotations

import json
from pathlib import Path

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
    _write(tmp_path, {"kind": "order", "ref": "w0.1.1", "sku": "a", "qty": 2, "r": "ok"})
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
