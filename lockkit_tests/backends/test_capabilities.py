"""The capability report: the system checks and ``manage.py lockkit_capabilities``."""

from __future__ import annotations

import io
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core import checks
from django.core.management import CommandError, call_command
from django.db import connections

from lockkit.capabilities import capabilities, configuration_warnings, memory_database_warnings
from lockkit.system_checks import (
    check_capabilities,
    check_configuration,
    check_memory_databases,
    check_settings,
)


def report(*aliases: str) -> str:
    out = io.StringIO()
    call_command(
        "lockkit_capabilities", *[arg for alias in aliases for arg in ("--database", alias)], stdout=out
    )
    return out.getvalue()


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_command_prints_a_table_per_alias() -> None:
    text = report("default", "sqlite")
    default, sqlite = text.split("\n\n")
    assert default.splitlines()[0] == "default (postgresql)"
    assert "  nowait (NOWAIT)                    yes" in default
    assert "  no_key (FOR NO KEY UPDATE)         yes" in default
    assert "transaction-scoped" in default
    assert sqlite.splitlines()[0] == "sqlite (sqlite)"
    assert "no: BEGIN IMMEDIATE locks the whole database" in sqlite
    assert "  statement_timeout                  not supported" in sqlite
    assert "warning: SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE'" in sqlite
    assert "  advisory locks                     pg_advisory_xact_lock (scope)" in default
    assert "  advisory locks                     inside a scope only" in sqlite


def test_command_reports_every_alias_by_default_and_refuses_unknown_ones() -> None:
    text = report()
    assert [block.splitlines()[0].split()[0] for block in text.split("\n\n")] == list(connections)
    with pytest.raises(CommandError, match="nope"):
        report("nope")


@pytest.mark.skipif(
    "mariadb" not in settings.DATABASES, reason="no MariaDB configured: set LOCKKIT_TEST_MYSQL_URL"
)
@pytest.mark.django_db(databases=["default", "mariadb"])
def test_mariadb_capabilities() -> None:
    caps = capabilities("mariadb")
    assert (caps.row_locks, caps.nowait, caps.skip_locked, caps.no_key) == (True, True, True, False)
    assert caps.of is (not connections["mariadb"].mysql_is_mariadb)  # type: ignore[attr-defined]
    assert caps.lock_timeout is not None
    assert "whole seconds" in caps.lock_timeout
    assert caps.advisory_locks is not None
    assert caps.advisory_locks.startswith("GET_LOCK/RELEASE_LOCK")


def test_sqlite_warning_goes_away_with_immediate_transactions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [m.id for m in check_configuration() if m.obj == "sqlite"] == ["lockkit.W001"]
    monkeypatch.setitem(connections["sqlite"].settings_dict["OPTIONS"], "transaction_mode", "IMMEDIATE")
    assert configuration_warnings("sqlite") == []


def test_a_pooler_port_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    assert configuration_warnings("other") == []
    monkeypatch.setitem(connections["other"].settings_dict, "PORT", "6432")
    warnings = configuration_warnings("other")
    assert len(warnings) == 2
    assert "connection pooler (PgBouncer's default port 6432)" in warnings[0]
    assert "advisory_lock(session=True) needs one server session" in warnings[0]
    assert "DISABLE_SERVER_SIDE_CURSORS" in warnings[1]
    monkeypatch.setitem(connections["other"].settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    assert len(configuration_warnings("other")) == 1


@pytest.mark.django_db(databases=["default"])
def test_database_check_reports_capabilities_only_for_the_aliases_given() -> None:
    assert check_capabilities() == []
    (message,) = check_capabilities(databases=["default"])
    assert message.id == "lockkit.I001"
    assert message.obj == "default"
    assert message.msg.startswith(
        "lockkit on postgresql: row locks, nowait, skip_locked, of, no_key; lock_timeout:"
    )


def test_import_lockkit_does_not_need_the_app_installed() -> None:
    code = (
        "import django; from django.conf import settings; settings.configure(); django.setup(); "
        "import lockkit; from django.apps import apps; "
        "print(apps.is_installed('lockkit'), lockkit.__version__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split()[0] == "False"


@pytest.mark.django_db(databases=["default"])
def test_routine_commands_run_no_informational_check() -> None:
    """migrate/runserver run the database checks for their alias: lockkit adds nothing there (no I001)."""
    ids = [m.id for m in checks.run_checks(databases=["default"]) if m.id and m.id.startswith("lockkit.")]
    assert "lockkit.I001" not in ids
    deploy = checks.run_checks(databases=["default"], include_deployment_checks=True)
    assert "lockkit.I001" in [m.id for m in deploy]  # check --deploy --database default still reports it


@pytest.mark.parametrize(
    ("value", "expected_id", "words"),
    [
        ({"LOCK_TIMOUT": 2}, "lockkit.E002", ["'LOCK_TIMOUT'", "Did you mean 'LOCK_TIMEOUT'?", "RETRY"]),
        ({"LOCK_TIMEOUT": "3s"}, "lockkit.E003", ["LOCKKIT['LOCK_TIMEOUT']", "str"]),
        ({"STATEMENT_TIMEOUT": -1}, "lockkit.E003", ["LOCKKIT['STATEMENT_TIMEOUT']", "positive"]),
        ({"RETRY": {"attemps": 3}}, "lockkit.E003", ["LOCKKIT['RETRY']", "attemps"]),
        ({"RETRY": 3}, "lockkit.E003", ["LOCKKIT['RETRY']", "int"]),
        (
            {"OBSERVERS": "lockkit.contrib.prometheus.install"},
            "lockkit.E003",
            ["LOCKKIT['OBSERVERS']", "list"],
        ),
        (["LOCK_TIMEOUT"], "lockkit.E001", ["must be a dict", "list"]),
    ],
)
def test_check_refuses_a_bad_lockkit_setting(
    settings: Any, value: object, expected_id: str, words: list[str]
) -> None:
    from django.core.management.base import SystemCheckError

    settings.LOCKKIT = value
    (message,) = check_settings()
    assert message.id == expected_id
    assert message.level == checks.ERROR
    text = f"{message.msg} {message.hint}"
    for word in words:
        assert word in text
    with pytest.raises(SystemCheckError, match=expected_id):
        # Only lockkit's app: Django 6's model checks of other apps' JSONFields would query the SQLite alias.
        call_command("check", "lockkit", stdout=io.StringIO(), stderr=io.StringIO())


def test_check_accepts_good_lockkit_settings(settings: Any) -> None:
    settings.LOCKKIT = {
        "LOCK_TIMEOUT": timedelta(seconds=2),
        "STATEMENT_TIMEOUT": None,
        "RETRY": {"attempts": 5},
    }
    assert check_settings() == []
    settings.LOCKKIT = {}
    assert check_settings() == []


def test_in_memory_sqlite_databases_are_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    sqlite = connections["sqlite"].settings_dict
    assert memory_database_warnings("sqlite") == []  # the suite's own: files
    assert memory_database_warnings("default") == []
    monkeypatch.setitem(sqlite, "TEST", {})
    (warning,) = memory_database_warnings("sqlite")
    assert "test database of 'sqlite' is an in-memory SQLite database" in warning
    assert [m.id for m in check_memory_databases() if m.obj == "sqlite"] == ["lockkit.W003"]
    monkeypatch.setitem(sqlite, "NAME", ":memory:")
    (warning,) = memory_database_warnings("sqlite")
    assert "'sqlite' is an in-memory SQLite database" in warning
