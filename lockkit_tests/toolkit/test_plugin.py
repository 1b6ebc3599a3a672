"""Tests of lockkit.pytest_plugin: the contention fixture and marker; it never breaks Django-less runs."""

from __future__ import annotations

import os
import textwrap
import threading
from pathlib import Path

import pytest
from django.db import connection

from lockkit.testing import ContentionKit, ContentionTimeout, in_thread
from lockkit_tests.models import Item

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]


def _run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    """Run ``source`` as a test module in a fresh pytest process (this one has Django set up already)."""
    pytester.makeini("[pytest]\n")  # keep this project's addopts and settings out of it
    pytester.makepyfile(test_sample=textwrap.dedent(source))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)


def test_contention_fixture_gives_a_transactional_database(contention: ContentionKit) -> None:
    assert not connection.in_atomic_block  # a TestCase-style test would run inside a transaction
    Item.objects.create(name="seen", value=1)
    assert contention.in_thread(Item.objects.filter(name="seen").count).result(timeout=5) == 1
    with contention.monitor(interval=0.005) as monitor:  # the kit's LockWaitMonitor: nobody waits here
        assert Item.objects.update(value=2) == 1
    assert monitor.polls >= 1
    assert monitor.waits == []


@pytest.mark.contention
def test_contention_marker_alone_makes_the_test_transactional() -> None:
    assert not connection.in_atomic_block
    Item.objects.create(name="seen", value=1)
    assert in_thread(Item.objects.count).result(timeout=5) == 1


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


def test_plugin_leaves_a_run_without_django_settings_alone(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    source = """
        import sys

        def test_plain():
            assert "lockkit.testing" not in sys.modules
        """
    _run(pytester, source).assert_outcomes(passed=1)
    _run(pytester, "", "--markers").stdout.fnmatch_lines(["*@pytest.mark.contention(timeout=10.0)*"])


def test_plugin_fails_a_contention_test_that_is_not_transactional(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "lockkit_tests.settings")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # A database name of its own: this session's test databases are in use.
    url = os.environ.get("LOCKKIT_TEST_DATABASE_URL")
    monkeypatch.setenv("LOCKKIT_TEST_DATABASE_URL", url.rstrip("/") + "_plugin" if url else "")
    monkeypatch.delenv("LOCKKIT_TEST_MYSQL_URL", raising=False)
    result = _run(
        pytester,
        """
        import pytest

        from django.test import TestCase

        from lockkit.testing import NothingLocked, hold_lock, run_concurrently
        from lockkit_tests.models import Item

        @pytest.mark.contention
        @pytest.mark.django_db
        def test_in_a_transaction():
            pass

        @pytest.mark.contention
        class TestInATestCase(TestCase):  # Django's TestCase wraps each test in a transaction too
            def test_in_a_testcase(self):
                pass

        class TestHoldLockInATestCase(TestCase):  # no marker: hold_lock itself explains the invisible rows
            def test_hold_lock_refuses_rows_its_session_cannot_see(self):
                item = Item.objects.create(name="uncommitted", value=1)
                with self.assertRaisesRegex(NothingLocked, "matched no rows.*TestCase"), hold_lock(item):
                    pass

        class TestRunConcurrentlyInATestCase(TestCase):  # run_concurrently explains its callers' DoesNotExist
            def test_run_concurrently_explains_rows_its_callers_cannot_see(self):
                pk = Item.objects.create(name="uncommitted", value=1).pk
                (outcome,) = run_concurrently(lambda: Item.objects.get(pk=pk), 1)
                self.assertIsInstance(outcome.error, Item.DoesNotExist)
                self.assertRegex(outcome.error.__notes__[0], "did not find the row.*TestCase")
        """,
    )
    result.stdout.fnmatch_lines(["*a contention test needs django_db(transaction=True)*"])
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 2, result.stdout.str()
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) == 2, result.stdout.str()


@pytest.mark.contention(0.3)
def test_contention_marker_takes_its_timeout_positionally(contention: ContentionKit) -> None:
    assert contention.timeout == 0.3


@pytest.mark.parametrize(
    ("ini", "args", "forced"),
    [
        ("", (), True),
        ("lockkit_unlocked_save_warnings = false\n", (), None),
        ("", ("-p", "no:lockkit"), None),
    ],
    ids=["default", "ini-off", "plugin-off"],
)
def test_plugin_turns_the_unlocked_save_check_on_unless_told_not_to(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    ini: str,
    args: tuple[str, ...],
    forced: bool | None,
) -> None:
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)  # no settings read: the flag alone is set
    pytester.makeini("[pytest]\n" + ini)
    pytester.makepyfile(
        test_sample=f"""
        from lockkit.scopes import unlocked

        def test_flag():
            assert unlocked._forced is {forced}
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)
    result.assert_outcomes(passed=1)
