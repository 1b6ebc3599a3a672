"""A bad ``settings.LOCKKIT`` is a system-check error, never a crash of every ``manage.py`` command.

Run for real: the sample project's ``manage.py`` in a subprocess, with a settings module that changes only
``LOCKKIT``; and in-process through ``call_command("check")``. At run time every lockkit call that reads the settings
refuses them with ``ImproperlyConfigured`` (also a ``TypeError``/``ValueError``), never falling back to defaults.
"""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit import conf
from lockkit.system_checks import check_settings

ROOT = Path(__file__).resolve().parents[2]

# (LOCKKIT as Python source, the check id, words its message and hint must hold)
BAD = {
    "typo": ('{"LOCK_TIMEOT": 3}', "lockkit.E002", ["'LOCK_TIMEOT'", "Did you mean 'LOCK_TIMEOUT'?"]),
    "not a dict": (
        '["LOCK_TIMEOUT"]',
        "lockkit.E001",
        ["must be a dict, not list", "LOCK_TIMEOUT, OBSERVERS"],
    ),
    "a string": ('"LOCK_TIMEOUT=3"', "lockkit.E001", ["must be a dict, not str"]),
    "bad value": ('{"LOCK_TIMEOUT": "3s"}', "lockkit.E003", ["LOCKKIT['LOCK_TIMEOUT']"]),
    "observers not a list": (
        '{"OBSERVERS": "lockkit.contrib.prometheus.install"}',
        "lockkit.E003",
        ["LOCKKIT['OBSERVERS'] must be a list"],
    ),
    "observer typo": (
        '{"OBSERVERS": ["lockkit.contrib.prometheus.instal"]}',
        "lockkit.E004",
        [
            "'lockkit.contrib.prometheus.instal'",
            "cannot be imported",
            "Did you mean lockkit.contrib.prometheus.install?",
        ],
    ),
    "observer not callable": (
        '{"OBSERVERS": ["lockkit.conf.KNOWN_KEYS"]}',
        "lockkit.E004",
        ["'lockkit.conf.KNOWN_KEYS', which is a frozenset, not a callable"],
    ),
    "observer path not dotted": ('{"OBSERVERS": [""]}', "lockkit.E004", ["doesn't look like a module path"]),
    "observer module missing": (
        '{"OBSERVERS": ["lockkit.contrib.prometheos.install"]}',
        "lockkit.E004",
        ["No module named 'lockkit.contrib.prometheos'"],
    ),
}


def manage(tmp_path: Path, lockkit_setting: str, *command: str) -> subprocess.CompletedProcess[str]:
    """Run the sample project's manage.py with its settings, ``LOCKKIT`` replaced."""
    (tmp_path / "bad_lockkit_settings.py").write_text(
        textwrap.dedent(
            f"""
            from sample_project.settings import *  # noqa: F403

            LOCKKIT = {lockkit_setting}
            """
        )
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bad_lockkit_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        # Never connected to by these commands; the sample settings refuse to load without a URL.
        "SAMPLE_DATABASE_URL": "postgres://nobody@127.0.0.1:1/never_connected",
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *command],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
        check=False,
    )


@pytest.mark.parametrize("case", ["typo", "not a dict"])
def test_manage_py_check_reports_a_bad_lockkit_setting_without_a_traceback(tmp_path: Path, case: str) -> None:
    setting, check_id, words = BAD[case]
    result = manage(tmp_path, setting, "check", "lockkit")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    assert "SystemCheckError: System check identified some issues" in result.stderr
    assert f"({check_id})" in result.stderr
    for word in words:
        assert word in result.stderr
    # A command that runs no checks loads the apps too: it works.
    result = manage(tmp_path, setting, "diffsettings", "--output", "unified")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "LOCKKIT" in result.stdout


def test_manage_py_check_passes_with_the_sample_projects_own_setting(tmp_path: Path) -> None:
    result = manage(
        tmp_path, '{"LOCK_TIMEOUT": 2.0, "OBSERVERS": ["lockkit.contrib.prometheus.install"]}', "check"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.parametrize("case", list(BAD))
def test_call_command_check_reports_each_bad_setting(case: str, caplog: pytest.LogCaptureFixture) -> None:
    setting, check_id, words = BAD[case]
    value = eval(setting)  # the literal the subprocess's settings module holds
    with override_settings(LOCKKIT=value):
        (message,) = check_settings()
        assert (message.id, message.level) == (check_id, checks.ERROR)
        text = f"{message.msg} {message.hint}"
        for word in words:
            assert word in text
        with caplog.at_level(logging.ERROR, logger="lockkit"):
            apps.get_app_config("lockkit").ready()  # app loading never raises on LOCKKIT
        if check_id == "lockkit.E004":
            assert "lockkit.E004" in caplog.text  # the skipped observer is logged where no check runs
        with pytest.raises(SystemCheckError, match=check_id):
            # Only lockkit's app: Django 6's model checks of other apps' JSONFields would query the SQLite alias.
            call_command("check", "lockkit", stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case", [case for case in BAD if BAD[case][1] != "lockkit.E004"])
def test_every_locked_call_refuses_a_bad_setting_before_sql(case: str) -> None:
    """Where no check runs (gunicorn), the first locked call fails rather than use defaults it was not given."""
    setting, _, words = BAD[case]
    with override_settings(LOCKKIT=eval(setting)):
        for call in (lambda: lockkit.locked().__enter__(), lockkit.locked_operation(lambda: None)):
            with CaptureQueriesContext(connections["default"]) as queries:
                with pytest.raises(ImproperlyConfigured, match=re.escape(words[0])):
                    call()
            assert len(queries) == 0
        assert not connections["default"].in_atomic_block
    if case == "typo":
        with (
            override_settings(LOCKKIT=eval(setting)),
            pytest.raises(ValueError, match="Did you mean 'LOCK_TIMEOUT'"),
        ):
            lockkit.locked_operation(lambda: None)()


def test_setting_errors_are_improperly_configured_and_the_builtin_types() -> None:
    assert issubclass(conf.SettingTypeError, ImproperlyConfigured)
    assert issubclass(conf.SettingTypeError, TypeError)
    assert issubclass(conf.SettingValueError, ImproperlyConfigured)
    assert issubclass(conf.SettingValueError, ValueError)


def test_hostile_keys_get_a_hint_too(settings: Any) -> None:
    settings.LOCKKIT = {3: 1, None: 2, "lock_timeout": 1, "X" * 10_000: 0}
    messages = check_settings()
    assert [m.id for m in messages] == ["lockkit.E002"] * 4
    hints = [str(m.hint) for m in messages]
    assert "Did you mean 'LOCK_TIMEOUT'?" in hints[2]
    assert all(
        "Valid keys: ADVISORY_NAMESPACE, LOCKS_PRESETS, LOCK_TIMEOUT, OBSERVERS, RETRY, STATEMENT_TIMEOUT."
        in hint
        for hint in hints
    )
