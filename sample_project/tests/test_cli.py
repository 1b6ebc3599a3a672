"""The demo's command line: options refused before a database starts, the invariant check, and a real run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connections

from sample_project.demo.bootstrap import url_of
from sample_project.demo.cli import main
from sample_project.demo.flash_sale import SaleAudit, SaleResult
from sample_project.demo.runner import DemoResult, broken_invariants
from sample_project.demo.stats import Totals


def _sale(implementation: str, *, oversold: int, lost: int, units: int) -> SaleResult:
    audit = SaleAudit(
        initial=10, remaining=10 - units + lost, reserved=units, oversold=oversold, lost_updates=lost
    )
    return SaleResult(implementation, Totals(operations=5, successes=5, units=units), audit)


def test_a_broken_lockkit_invariant_is_reported_and_a_naive_one_is_not() -> None:
    """What makes ``python -m sample_project demo`` exit with status 1."""
    honest = DemoResult(orders=5, skus=1, sales=[_sale("naive", oversold=2, lost=2, units=12)])
    assert broken_invariants(honest) == []
    broken = DemoResult(orders=5, skus=1, sales=[_sale("lockkit", oversold=1, lost=1, units=11)])
    problems = broken_invariants(broken)
    assert any("1 units oversold" in p for p in problems)
    assert any("remaining stock" in p for p in problems)


def test_the_command_line_refuses_bad_options_before_starting_a_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "orders.csv"
    bad.write_text("sku,quantity\na,0\n")
    cases = [
        (["demo", "--workers", "0"], "must be a positive integer"),
        (["demo", "--workers", "1"], "at least 2"),
        (["demo", "--limit", "-3"], "must be a positive integer"),
        (["demo", "--stock-ratio", "0"], "must be a positive number"),
        (["demo", "--orders", str(tmp_path / "missing.csv")], "No such file"),
        (["demo", "--orders", str(bad)], "orders.csv:2"),
        (["nonsense"], "invalid choice"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert message in capsys.readouterr().err


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m sample_project ...`` in a fresh interpreter, as a user runs it (no Django set up yet)."""
    clean = {
        k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "SAMPLE_DATABASE_URL"}
    }
    return subprocess.run(
        [sys.executable, "-m", "sample_project", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_python_m_sample_project_refuses_bad_options_with_status_2() -> None:
    result = _run_cli("demo", "--workers", "1")
    assert result.returncode == 2, result.stderr
    assert "at least 2" in result.stderr


@pytest.mark.django_db(transaction=True)
@pytest.mark.contention
def test_python_m_sample_project_demo_runs_and_exits_0() -> None:
    """The command line end to end, on the test database: tables printed, invariants hold, status 0."""
    url = url_of(connections["default"].settings_dict)
    result = _run_cli(
        "demo", "--workers", "2", "--limit", "200", "--jobs", "20", env={"SAMPLE_DATABASE_URL": url}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "units oversold" in result.stdout
    assert "jobs lost" in result.stdout
    assert "lockkit invariants hold" in result.stdout
    # Four sales by default: the naive one (on its first orders: here all 200), the hand-written one and lockkit's
    # two forms, each naming its code; no "n/a" cell; the figures explained; the naive job queue only with --naive.
    for code in ("reserve_stock_naive", "reserve_stock_by_hand", "reserve_stock", "reserve_stock_guarded"):
        assert f" {code}\n" in result.stdout
    assert "n/a" not in result.stdout
    assert "naive read-then-write (200 orders)" in result.stdout
    assert "lockkit locked_update's throughput is" in result.stdout
    assert "lockkit guarded_update's throughput is" in result.stdout
    assert "naive read-then-mark" not in result.stdout


def test_naive_runs_the_whole_naive_sale_and_the_old_guarded_flag_still_parses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sample_project.demo.cli import _parser

    assert _parser().parse_args(["demo"]).naive is False  # the naive sale on its first 2,000 orders only
    assert _parser().parse_args(["demo", "--naive"]).naive is True
    old = _parser().parse_args(["demo", "--guarded"])  # the guarded UPDATE runs by default now
    assert (old.naive, old.guarded) == (False, True)
    with pytest.raises(SystemExit):
        _parser().parse_args(["demo", "--help"])
    shown = capsys.readouterr().out
    assert "--naive" in shown
    assert "2,000" in shown
    assert "--guarded" not in shown
