"""The Patroni topology test runs only when ``-m`` names its marker: never in the default run, never in the
contention step (``-m contention``), always with ``-m patroni`` (lockkit_tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

TEST = "lockkit_tests/topology/test_patroni.py::test_workers_on_a_patroni_cluster_through_switchover_crash_and_a_dead_peer"


def _collected(*args: str) -> bool:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *args, TEST]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, env=os.environ.copy()
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: nothing collected
    return TEST in done.stdout.splitlines()


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        pytest.param((), False, id="default run"),
        pytest.param(("-m", "contention"), False, id="contention step"),
        pytest.param(("-m", "patroni"), True, id="patroni step"),
    ],
)
def test_the_patroni_test_is_selected_only_when_m_names_it(args: tuple[str, ...], runs: bool) -> None:
    assert _collected(*args) is runs
