"""``lockkit.inspection.cancel()``/``terminate()`` and ``lockkit_locks --cancel/--terminate`` signal client sessions
of the alias's database only: never a parallel worker or another server process (they stay alive), and a privilege
the database refuses is ``SignalNotPermitted`` (a ``CommandError`` in the command), never a raw traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, OperationalError, connections

import lockkit.inspection
from lockkit.testing import backend_pid, in_thread
from lockkit_tests.support.locks_process import environment
from lockkit_tests.support.vendors import vendor_params

ROLE = "lk_h4_signaller"
DEADLINE = 20.0


def _activity(pid: int) -> tuple[str, str | None] | None:
    """``(backend_type, datname)`` of ``pid`` as ``pg_stat_activity`` shows it now, or ``None``."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT backend_type, datname FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def _poll(query: str, params: list[Any]) -> int:
    """Poll the database (every 10 ms, at most ``DEADLINE`` s) until ``query`` returns a pid."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        with connections["default"].cursor() as cursor:
            cursor.execute(query, params)
            row = cursor.fetchone()
        if row is not None:
            return int(row[0])
        time.sleep(0.01)
    raise AssertionError(f"nothing matched within {DEADLINE}s: {query}")


def _parallel_sleep(started: dict[str, int]) -> None:
    """Run pg_sleep in a parallel worker of this database (forced parallel plan) until the test cancels it."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version_num')::int")
        (version,) = cursor.fetchone()
        setting = "debug_parallel_query" if version >= 160000 else "force_parallel_mode"
        for name, value in ((setting, "on"), ("parallel_setup_cost", "0"), ("parallel_tuple_cost", "0")):
            cursor.execute("SELECT set_config(%s, %s, false)", [name, value])
        started["leader"] = backend_pid("default")
        cursor.execute("SELECT pg_sleep(60)")


@pytest.mark.contention
@pytest.mark.django_db(transaction=True)
def test_a_parallel_worker_of_this_database_is_refused_and_stays_alive() -> None:
    started: dict[str, int] = {}
    leader = in_thread(_parallel_sleep, started)
    try:
        worker = _poll(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'parallel worker' AND datname = "
            "current_database() AND leader_pid IS NOT NULL",
            [],
        )
        assert started["leader"] != worker
        # A background process of this very database: the old check (same database) would have signalled it.
        assert _activity(worker) == ("parallel worker", connections["default"].settings_dict["NAME"])
        for signal in (lockkit.inspection.terminate, lockkit.inspection.cancel):
            with pytest.raises(ValueError, match="'parallel worker', not a client's session") as caught:
                signal(worker)
            assert "nothing was signalled" in str(caught.value)
        for flag in ("--terminate", "--cancel"):
            with pytest.raises(CommandError, match="not a client's session"):
                call_command("lockkit_locks", flag, str(worker), "--no-input")
        assert _activity(worker) == ("parallel worker", connections["default"].settings_dict["NAME"])
        assert lockkit.inspection.cancel(started["leader"]).sent  # the leader is a client backend
        assert isinstance(leader.outcome(timeout=30).error, OperationalError)
    finally:
        if not leader.done() and "leader" in started:
            lockkit.inspection.terminate(started["leader"])
        leader.join(30)
    assert leader.done()


@pytest.mark.django_db(transaction=True)
def test_a_server_process_with_no_database_is_refused_and_stays_alive() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'")
        (checkpointer,) = cursor.fetchone()
    for signal in (lockkit.inspection.terminate, lockkit.inspection.cancel):
        with pytest.raises(ValueError, match="'checkpointer', not a client's session"):
            signal(checkpointer)
    with pytest.raises(CommandError, match="'checkpointer', not a client's session"):
        call_command("lockkit_locks", "--terminate", str(checkpointer), "--no-input")
    assert _activity(checkpointer) == ("checkpointer", None)


@pytest.fixture
def unprivileged(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A login role (PostgreSQL) or user (MariaDB) of its own, dropped after; yields its DATABASES entry."""
    alias = request.node.callspec.params["alias"]
    admin = connections.create_connection(alias)
    try:
        with admin.cursor() as cursor:
            if alias == "default":
                cursor.execute(f"DROP ROLE IF EXISTS {ROLE}")
                cursor.execute(f"CREATE ROLE {ROLE} LOGIN")
            else:
                name = admin.ops.quote_name(admin.settings_dict["NAME"])
                cursor.execute(f"DROP USER IF EXISTS '{ROLE}'@'%'")
                cursor.execute(f"CREATE USER '{ROLE}'@'%'")
                # PROCESS: it sees every session (else another user's is invisible, "no session"); no SUPER or
                # CONNECTION ADMIN: it may not KILL them.
                cursor.execute(f"GRANT PROCESS ON *.* TO '{ROLE}'@'%'")
                cursor.execute(f"GRANT ALL ON {name}.* TO '{ROLE}'@'%'")
        yield {**admin.settings_dict, "USER": ROLE, "PASSWORD": ""}
    finally:
        with admin.cursor() as cursor:
            if alias == "default":
                cursor.execute(f"DROP ROLE IF EXISTS {ROLE}")
            else:
                cursor.execute(f"DROP USER IF EXISTS '{ROLE}'@'%'")
        admin.close()


def _session_id(connection: Any) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT CONNECTION_ID()"
        )
        return int(cursor.fetchone()[0])


def _process(database: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lockkit_tests.support.locks_process", *args],
        env=environment(database),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _refused(database: dict[str, Any], pid: int, code: str) -> None:
    """As ``database``'s user: the function raises SignalNotPermitted, the command exits 1 with one line."""
    done = _process(database, "terminate-function", str(pid))
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert f"SignalNotPermitted code={code} pid={pid} action=terminate" in done.stdout
    assert "nothing was signalled" in done.stdout
    for flag in ("--terminate", "--cancel"):
        done = _process(database, "lockkit_locks", flag, str(pid), "--no-input")
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        action = "terminate" if flag == "--terminate" else "cancel"
        assert done.stderr.startswith(f"CommandError: not permitted to {action} session {pid}"), done.stderr
        assert done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("alias", vendor_params())
def test_a_privilege_the_database_refuses_is_a_typed_error_and_a_command_error(
    alias: str, unprivileged: dict[str, Any]
) -> None:
    # A session of the superuser (postgres / root), which the new role may not signal.
    stranger = connections.create_connection(alias)
    try:
        pid = _session_id(stranger)
        if alias == "default":
            # Without pg_read_all_stats the role cannot see the session's backend_type: lockkit refuses to signal
            # what it cannot check (code None), before any signal.
            _refused(unprivileged, pid, "None")
            with connections["default"].cursor() as cursor:
                cursor.execute(f"GRANT pg_read_all_stats TO {ROLE}")
            # Now it sees a client backend of its database, and PostgreSQL itself refuses: SQLSTATE 42501.
            _refused(unprivileged, pid, "42501")
        else:
            _refused(unprivileged, pid, "1095")
        assert _session_id(stranger) == pid  # still alive: nothing was signalled
    finally:
        stranger.close()


def test_signal_not_permitted_is_a_database_error() -> None:
    error = lockkit.inspection.SignalNotPermitted("default", 12, "cancel", "42501")
    assert isinstance(error, DatabaseError)
    assert (error.alias, error.pid, error.action, error.code) == ("default", 12, "cancel", "42501")
    assert "not permitted to cancel session 12" in str(error)
