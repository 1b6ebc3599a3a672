"""Public signatures are typed: mypy itself rejects a duration given as text (``lock_timeout="3s"``).

Runs mypy (its API, on a small snippet) the way a user's type check would see lockkit: through its ``py.typed``.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

SNIPPET = """
from datetime import timedelta

import lockkit
from lockkit.claims import heartbeat, claim_next
from lockkit.testing import hold_lock, run_concurrently, wait_until_blocked
from lockkit_tests.models import Item


def ok(claim: "lockkit.claims.Claim") -> None:
    with lockkit.locked(lock_timeout=3, statement_timeout=timedelta(seconds=1)) as scope:
        item: Item = scope.get(Item.objects.get(pk=1))  # an instance: its row, re-read under lock
        scope.lock(item)
    lockkit.locked_operation(lock_timeout=0.5)(print)
    lockkit.RetryPolicy(wait_initial=1, wait_max=timedelta(seconds=1), deadline=2.5)
    heartbeat(claim, lease=timedelta(minutes=1))
    with hold_lock(item, timeout=timedelta(seconds=5)):
        pass


def bad(claim: "lockkit.claims.Claim") -> None:
    lockkit.locked(lock_timeout="3s")  # BAD
    lockkit.locked_operation(statement_timeout="1s")  # BAD
    lockkit.RetryPolicy(deadline="2s")  # BAD
    heartbeat(claim, lease="60")  # BAD
    hold_lock(Item, timeout="5")  # BAD
    wait_until_blocked(1, timeout="5")  # BAD
    run_concurrently(print, 2, timeout="5")  # BAD
    claim_next(Item.objects.all(), worker="w", lease="30s")  # BAD
"""


def test_mypy_rejects_durations_given_as_text(tmp_path: Path) -> None:
    source = tmp_path / "snippet.py"
    source.write_text(textwrap.dedent(SNIPPET).lstrip("\n"))
    config = tmp_path / "mypy.ini"
    root = Path(__file__).resolve().parents[2]  # lockkit and lockkit_tests, wherever pytest runs from
    config.write_text(f"[mypy]\nstrict = True\nwarn_unused_ignores = False\nmypy_path = {root}\n")
    stdout, stderr, _status = mypy_api.run(
        ["--config-file", str(config), "--cache-dir", str(tmp_path / "cache"), str(source)]
    )
    lines = SNIPPET.lstrip("\n").splitlines()
    bad = {n for n, line in enumerate(lines, start=1) if line.endswith("# BAD")}
    flagged = {int(m.group(1)) for m in re.finditer(r"snippet\.py:(\d+): error:", stdout)}
    assert flagged == bad, stdout + stderr  # every text duration refused, every real one accepted
    assert 'Argument "lock_timeout"' in stdout or '"locked" matches argument type "str"' in stdout
