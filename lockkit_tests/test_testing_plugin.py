"""Tests of lockkit.pytest_plugin: the contention fixture and marker; it never breaks Django-less runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from django.db import connection, connections

from lockkit.testing import ContentionKit, ContentionTimeout
from lockkit_tests.models import Item

ROOT = Path(__file__).resolve().parent.parent


def _pytest(tmp_path: Path, source: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(source))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # keep this project's addopts and settings out of it
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sample.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _env_without_django() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}


def test_contention_fixture_gives_a_transactional_database(contention: ContentionKit) -> None:
    assert not connection.in_atomic_block  # a TestCase-style test would run inside a transaction
    Item.objects.create(name="seen", value=1)
    assert contention.in_thread(Item.objects.filter(name="seen").count).result(timeout=5) == 1


@pytest.mark.contention
def test_contention_marker_alone_makes_the_test_transactional() -> None:
    assert not connection.in_atomic_block
    Item.objects.create(name="seen", value=1)
    seen: list[int] = []

    def count() -> None:
        try:
            seen.append(Item.objects.count())
        finally:
            connections.close_all()

    thread = threading.Thread(target=count)
    thread.start()
    thread.join(5)
    assert seen == [1]


@pytest.mark.contention(timeout=0.2)
def test_contention_kit_fails_when_a_thread_outlives_the_test(contention: ContentionKit) -> None:
    assert contention.timeout == 0.2
    never = threading.Event()
    contention.in_thread(never.wait, 30)
    try:
        with pytest.raises(ContentionTimeout, match="still running at the end of the test"):
            contention.close()
    finally:
        never.set()


def test_plugin_leaves_a_run_without_django_settings_alone(tmp_path: Path) -> None:
    result = _pytest(
        tmp_path,
        """
        import sys

        def test_plain():
            assert "lockkit.testing" not in sys.modules
        """,
        env=_env_without_django(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    markers = subprocess.run(
        [sys.executable, "-m", "pytest", "--markers", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=_env_without_django(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "@pytest.mark.contention(timeout=10.0)" in markers.stdout


def test_plugin_fails_a_contention_test_that_is_not_transactional(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "lockkit_tests.settings",
        "PYTHONPATH": str(ROOT),
        # A database name of its own: this session's test databases are in use.
        "LOCKKIT_TEST_DATABASE_URL": os.environ.get("LOCKKIT_TEST_DATABASE_URL", "").rstrip("/") + "_plugin"
        if os.environ.get("LOCKKIT_TEST_DATABASE_URL")
        else "",
    }
    env.pop("LOCKKIT_TEST_MYSQL_URL", None)
    result = _pytest(
        tmp_path,
        """
        import pytest

        from django.test import TestCase

        @pytest.mark.contention
        @pytest.mark.django_db
        def test_in_a_transaction():
            pass

        @pytest.mark.contention
        class TestInATestCase(TestCase):  # Django's TestCase wraps each test in a transaction too
            def test_in_a_testcase(self):
                pass
        """,
        env=env,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "a contention test needs django_db(transaction=True)" in result.stdout
    assert "2 failed" in result.stdout or "2 errors" in result.stdout, result.stdout


@pytest.mark.contention(0.3)
def test_contention_marker_takes_its_timeout_positionally(contention: ContentionKit) -> None:
    assert contention.timeout == 0.3
