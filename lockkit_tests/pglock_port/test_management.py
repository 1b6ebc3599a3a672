"""django-pglock's ``tests/test_management.py`` on ``manage.py lockkit_locks``: listing, filters and the
confirmation before a session is signalled, with real blocked sessions in threads and real answers on stdin
(``call_command(..., stdin=...)``, a pipe and a pseudo-terminal), never a mocked ``input()``.

pglock's command lists every lock of ``pg_locks`` (its own session's too) and filters them; ``lockkit_locks``
lists lock *waits* as trees (holder, then who waits behind it), on PostgreSQL and MariaDB. The ports below assert
the same decisions on that view; where pglock's test has no exact counterpart the docstring says what stands in.
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connections

from lockkit import locked
from lockkit.errors import ConnectionLost
from lockkit.testing import backend_pid, in_thread, wait_until_blocked
from lockkit.testing.threads import ThreadCall
from lockkit_tests.models import Item
from lockkit_tests.support.locks_process import environment
from lockkit_tests.support.vendors import vendor_params

BOTH = vendor_params()
NOBODY = "2000000000"  # a session id no server has


def _run(*args: str, stdin: str | None = None) -> list[str]:
    """Run the command; return its output's lines."""
    out = io.StringIO()
    extra: dict[str, Any] = {} if stdin is None else {"stdin": io.StringIO(stdin)}
    call_command("lockkit_locks", *args, stdout=out, **extra)
    return out.getvalue().splitlines()


class Blocked:
    """pglock's ``lock_1`` (the blocker) and ``lock_2`` (blocked behind it): two sessions in threads."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.item = Item.objects.using(alias).create(name="held")
        self.pids: dict[str, int] = {}
        self.holding, self.release = threading.Event(), threading.Event()
        self.holder: ThreadCall[str] = in_thread(self._hold)
        assert self.holding.wait(30)
        self.waiter: ThreadCall[str] = in_thread(self._wait)
        wait_until_blocked(self.pids["holder"], using=alias, contenders=self.waiter)
        self.pids["waiter"] = next(pid for pid in self._waiting_pids() if pid != self.pids["holder"])

    def _waiting_pids(self) -> list[int]:
        import lockkit.inspection

        return [wait.waiting.pid for wait in lockkit.inspection.blocking(self.alias)]

    def _hold(self) -> str:
        with locked(self.alias, lock_timeout=30) as scope:
            scope.get(Item, pk=self.item.pk)
            self.pids["holder"] = backend_pid(self.alias)
            self.holding.set()
            self.release.wait(30)
            return scope.get(Item, pk=self.item.pk).name  # a terminated session fails here

    def _wait(self) -> str:
        with locked(self.alias, lock_timeout=30) as scope:
            return scope.get(Item, pk=self.item.pk).name

    def finish(self) -> None:
        self.release.set()
        self.holder.join(30)
        self.waiter.join(30)
        assert self.holder.done()
        assert self.waiter.done()


def _body(lines: list[str]) -> list[str]:
    return lines[1:]  # below the header


@pytest.mark.parametrize("alias", BOTH)
def test_listing_with_nothing_blocked(alias: str) -> None:
    """Ports pglock's ``test_listing`` (its first part: ``pglock``, ``pglock -e``, ``pglock -c bad-pid``).

    pglock lists the locks its own session holds (at least one line); lockkit lists waits, so with nothing blocked
    every view is its header alone, and a preset filtering on a session that does not exist shows nothing.
    """
    assert _run("--database", alias) == [f"{alias}: 0 session(s) waiting for a lock"]
    assert _run("--database", alias, "-e") == [f"{alias}: 0 session(s) waiting for a lock"]
    assert _run("--database", alias, "--blocking") == [f"{alias}: 0 session(s) blocking others"]
    assert json.loads(_run("--database", alias, "--json")[0]) == []


@pytest.mark.contention
@pytest.mark.parametrize("alias", BOTH)
def test_listing_a_blocked_session_with_filters(alias: str) -> None:
    """Ports pglock's ``test_listing`` (its threads): ``pglock <blocking pid>``, ``pglock <blocked pid> -f
    granted=False``, ``--on auth.User``, ``<blocked pid> --blocking``.

    lockkit's filters: session ids (either end of a chain shows the chain), ``--min-wait`` (pglock filters
    ``wait_duration`` with ``-f``), ``--blocking`` (the blockers, with who waits behind them); pglock's ``--on
    <model>`` has no lockkit flag: the wait's target names the table, asserted here. A row lock stands in for
    pglock's table lock (``pglock.model``).
    """
    blocked = Blocked(alias)
    holder, waiter = blocked.pids["holder"], blocked.pids["waiter"]
    table = Item._meta.db_table
    try:
        for pid in (holder, waiter):
            lines = _body(_run("--database", alias, str(pid)))
            assert len(lines) == 2, lines
            assert f"pid {holder} " in lines[0]
            assert "holds the lock" in lines[0]
            assert f"pid {waiter} " in lines[1]
            assert "waits for" in lines[1]
            assert table in lines[1]  # what pglock's --on filters on
        assert _body(_run("--database", alias, NOBODY)) == []
        assert len(_body(_run("--database", alias, "--min-wait", "0"))) == 2
        assert len(_body(_run("--database", alias, "--wait-duration", "0", str(waiter)))) == 2
        assert _body(_run("--database", alias, "--min-wait", "3600")) == []
        (line,) = _body(_run("--database", alias, str(waiter), "--blocking"))
        assert line.startswith(f"pid {holder} ")
        assert "blocks 1 session(s)" in line
        (blocker,) = json.loads(_run("--database", alias, "--blocking", "--json")[0])
        assert (blocker["session"]["pid"], blocker["blocked_pids"]) == (holder, [waiter])
        expanded = _run("--database", alias, "-e", str(waiter))
        assert f"pid: {waiter}" in expanded
        assert f"blocked by: {holder}" in expanded
        assert f"chain: {holder} -> {waiter}" in expanded
        with pytest.raises(CommandError, match="minimum wait"):
            _run("--database", alias, "--min-wait", "-1")
    finally:
        blocked.finish()
    assert blocked.waiter.result(timeout=30) == "held"


@pytest.mark.contention
@pytest.mark.parametrize("alias", BOTH)
def test_terminating_the_blocker_asks_first(alias: str) -> None:
    """Ports pglock's ``test_listing`` (its end): ``pglock <blocked> --blocking --terminate`` exits without
    ``--yes`` when the answer is no; with ``--yes`` it terminates the blocker, whose transaction fails ("terminat").

    Here the answer is real text on stdin; "n" signals nothing (the holder still blocks), then ``--yes`` (lockkit's
    ``--no-input``) terminates it and the waiter goes on.
    """
    blocked = Blocked(alias)
    holder = blocked.pids["holder"]
    try:
        out = io.StringIO()
        with pytest.raises(CommandError, match="aborted: nothing was signalled"):
            call_command(
                "lockkit_locks",
                "--database",
                alias,
                "--terminate",
                str(holder),
                stdout=out,
                stdin=io.StringIO("n\n"),
            )
        said = out.getvalue()
        assert f"This will terminate session {holder} on {alias!r}:" in said
        assert "blocks 1 session(s)" in said
        assert f"sessions waiting behind it: {blocked.pids['waiter']}" in said
        assert f"Terminate session {holder}? [y/N] " in said
        assert not blocked.waiter.done()
        assert len(_body(_run("--database", alias))) == 2  # still blocked

        (done,) = _run("--database", alias, "--terminate", str(holder), "--yes")
        assert done.startswith(f"terminated session {holder}")
        assert blocked.waiter.result(timeout=30) == "held"
    finally:
        blocked.finish()
    error = blocked.holder.outcome(timeout=30).error
    # lockkit classifies it: the session is gone (PostgreSQL says "terminating connection due to administrator
    # command", pglock's "terminat"; MariaDB "Lost connection").
    assert isinstance(error, ConnectionLost), error
    assert error.alias == alias
    if alias == "default":
        assert "terminating connection" in str(error)


@pytest.mark.parametrize("answer", ["y\n", "yes\n", "Y\n", "YES\n"])
@pytest.mark.parametrize("alias", BOTH)
def test_yes_signals(alias: str, answer: str) -> None:
    """Ports pglock's ``test_handle_user_input`` (``input()`` answering "y": go on), with real stdin."""
    victim = connections.create_connection(alias)
    try:
        pid = _session_id(victim)
        lines = _run("--database", alias, "--cancel", str(pid), stdin=answer)
        assert lines[0] == f"This will cancel the statement of session {pid} on {alias!r}:"
        assert "(it waits for no lock and blocks no session)" in lines[1]
        assert lines[2].startswith(f"Cancel the statement of session {pid}? [y/N] ")
        assert lines[2].endswith(
            f"cancelled the statement of session {pid} on database "
            f"{victim.settings_dict['NAME']!r} ({alias!r})"
        )
        assert _session_id(victim) == pid  # an idle session's cancel is a no-op: it is still there
    finally:
        victim.close()


@pytest.mark.parametrize("answer", ["n\n", "no\n", "\n", "", "yess\n", "sure\n"])
@pytest.mark.parametrize("alias", BOTH)
def test_anything_but_yes_aborts(alias: str, answer: str) -> None:
    """Ports pglock's ``test_handle_user_input`` ("n": "Aborting!" and nothing done); end of input aborts too."""
    victim = connections.create_connection(alias)
    try:
        pid = _session_id(victim)
        with pytest.raises(CommandError, match="aborted: nothing was signalled"):
            _run("--database", alias, "--terminate", str(pid), stdin=answer)
        assert _session_id(victim) == pid  # not terminated
    finally:
        victim.close()


@pytest.mark.parametrize("flag", ["--no-input", "--noinput", "--yes", "-y"])
@pytest.mark.parametrize("alias", BOTH)
def test_no_input_signals_without_asking(alias: str, flag: str) -> None:
    """Ports pglock's ``test_handle_user_input`` (``cfg={"yes": True}``: no question, nothing written but the
    result), with Django's ``--no-input``/``--noinput`` and pglock's ``-y``/``--yes``."""
    victim = connections.create_connection(alias)
    try:
        pid = _session_id(victim)
        lines = _run("--database", alias, "--terminate", str(pid), flag, stdin="n\n")  # stdin is never read
        assert len(lines) == 1
        assert lines[0].startswith(f"terminated session {pid}")
        with pytest.raises(OperationalError):
            _session_id(victim)
    finally:
        victim.close()


@pytest.mark.parametrize("flag", ["--terminate", "--cancel"])
@pytest.mark.parametrize("alias", BOTH)
def test_nothing_to_signal_is_said_before_asking(alias: str, flag: str) -> None:
    """Ports pglock's ``test_handle_user_input`` (``num_locks=0``: "No queries to terminate/cancel." and no
    question): a session that does not exist is refused before the question is asked."""
    out = io.StringIO()
    with pytest.raises(CommandError, match=f"no session {NOBODY} .*nothing was signalled"):
        call_command("lockkit_locks", "--database", alias, flag, NOBODY, stdout=out, stdin=io.StringIO("y\n"))
    assert "[y/N]" not in out.getvalue()


def _session_id(connection: Any) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT CONNECTION_ID()"
        )
        return int(cursor.fetchone()[0])


def _command(alias: str, *args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lockkit_tests.support.locks_process",
            "lockkit_locks",
            "--database",
            "default",
            *args,
        ],
        env=environment(connections[alias].settings_dict),
        **kwargs,
    )


@pytest.mark.parametrize("alias", BOTH)
def test_a_pipe_without_no_input_is_refused_not_hung(alias: str) -> None:
    """Ports pglock's ``test_handle_user_input`` for a non-interactive caller, which pglock's ``input()`` would
    block on or read a stray line from: lockkit refuses when stdin is not a terminal (a ``CommandError``, exit 1),
    even if the pipe says "y"."""
    victim = connections.create_connection(alias)
    try:
        pid = _session_id(victim)
        process = _command(
            alias,
            "--terminate",
            str(pid),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = process.communicate(b"y\n", timeout=60)
        assert process.returncode == 1, (out, err)
        assert err.decode().startswith(
            f"CommandError: refusing to terminate session {pid} without confirmation"
        )
        assert b"Traceback" not in err
        assert _session_id(victim) == pid
    finally:
        victim.close()


def _read_until(fd: int, marker: bytes, deadline: float) -> bytes:
    seen = b""
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within the deadline; read {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the terminal closed: the process ended
                break
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.mark.parametrize(("answer", "signalled"), [(b"y\n", True), (b"n\n", False)])
@pytest.mark.parametrize("alias", BOTH)
def test_a_terminal_is_asked_and_answered(alias: str, answer: bytes, signalled: bool) -> None:
    """Ports pglock's ``test_handle_user_input`` end to end: a real terminal (a pseudo-terminal) shows the
    question, the typed answer decides."""
    victim = connections.create_connection(alias)
    master, slave = pty.openpty()
    try:
        pid = _session_id(victim)
        process = _command(alias, "--terminate", str(pid), stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
        deadline = time.monotonic() + 60
        shown = _read_until(master, b"[y/N] ", deadline)
        assert f"This will terminate session {pid}".encode() in shown
        os.write(master, answer)
        rest = _read_until(master, b"signalled" if not signalled else b"terminated session", deadline)
        assert process.wait(timeout=60) == (0 if signalled else 1), rest
        if signalled:
            with pytest.raises(OperationalError):
                _session_id(victim)
        else:
            assert b"aborted: nothing was signalled" in rest
            assert _session_id(victim) == pid
    finally:
        os.close(master)
        victim.close()


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-inf", "soon", ""])
def test_a_bad_minimum_wait_is_refused_before_any_sql(value: str) -> None:
    """Beyond pglock (whose ``-f wait_duration__gt=...`` reaches the ORM as text): ``--min-wait`` must be a finite
    number of seconds, at least 0, refused by the parser with the reason."""
    with pytest.raises(CommandError, match="minimum wait must be a finite number of seconds"):
        _run(f"--min-wait={value}")


@pytest.mark.parametrize("alias", vendor_params("other"))
def test_a_session_that_may_not_be_signalled_is_refused_before_the_question(alias: str) -> None:
    """Beyond pglock (which asks, then fails or signals): a session of another database is refused before the
    question is asked, so nobody confirms what would be refused."""
    stranger = connections.create_connection("other" if alias == "default" else alias)
    try:
        if alias != "default":
            with stranger.cursor() as cursor:
                cursor.execute("USE information_schema")
        pid = _session_id(stranger)
        out = io.StringIO()
        with pytest.raises(CommandError, match="another database"):
            call_command(
                "lockkit_locks",
                "--database",
                alias,
                "--terminate",
                str(pid),
                stdout=out,
                stdin=io.StringIO("y\n"),
            )
        assert "[y/N]" not in out.getvalue()
        assert _session_id(stranger) == pid
    finally:
        stranger.close()


@pytest.mark.parametrize(("action", "error"), [("kill", ValueError), ("", ValueError)])
def test_check_signal_checks_its_arguments_before_any_sql(action: Any, error: type[Exception]) -> None:
    """Beyond pglock: ``lockkit.inspection.check_signal`` refuses an unknown action, and a bad pid, by name."""
    import lockkit.inspection

    with pytest.raises(error, match="action"):
        lockkit.inspection.check_signal(1, action=action)
    with pytest.raises(TypeError, match="pid"):
        lockkit.inspection.check_signal("1")  # type: ignore[arg-type]
