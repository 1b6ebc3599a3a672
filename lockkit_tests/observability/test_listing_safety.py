"""``manage.py lockkit_locks`` prints other sessions' text escaped (a query's ``ESC [31m`` never reaches the
terminal raw; ``--json`` keeps the real text, JSON-escaped), and lists the sessions of the alias's database only."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections, transaction

import lockkit
import lockkit.inspection
from lockkit.backends.waits import OTHER_DATABASE
from lockkit.management.text import printable
from lockkit.testing import backend_pid, in_thread, wait_until_blocked
from lockkit_tests.models import Item
from lockkit_tests.support.vendors import vendor_params

ESCAPE = "/* \x1b[31m */"
HOLDER_ESCAPE = "/* \x1b]0;owned\x07 \x9b2J */"  # OSC (retitle the terminal) and an 8-bit CSI
RAW = ("\x1b", "\x07", "\x9b")


def _run(*args: str, stdin: str | None = None) -> str:
    out = io.StringIO()
    extra: dict[str, Any] = {} if stdin is None else {"stdin": io.StringIO(stdin)}
    call_command("lockkit_locks", *args, stdout=out, **extra)
    return out.getvalue()


def _lock_row(alias: str, pk: int, comment: str) -> None:
    table = connections[alias].ops.quote_name(Item._meta.db_table)
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE {comment}", [pk])


def _hold(
    alias: str, pk: int, pids: dict[str, int], holding: threading.Event, release: threading.Event
) -> None:
    with lockkit.locked(alias, lock_timeout=30):
        pids["holder"] = backend_pid(alias)
        _lock_row(alias, pk, HOLDER_ESCAPE)  # its last statement: what the listing shows of an idle holder
        holding.set()
        release.wait(30)


def _wait(alias: str, pk: int) -> None:
    with lockkit.locked(alias, lock_timeout=30):
        _lock_row(alias, pk, ESCAPE)


def _assert_escaped(text: str, *, holder: bool) -> None:
    for char in RAW:
        assert char not in text, repr(text)
    assert "\\x1b[31m" in text, text
    if holder:
        assert "\\x1b]0;owned\\x07" in text, text
        assert "\\x9b2J" in text, text


@pytest.mark.contention
@pytest.mark.parametrize("alias", vendor_params())
def test_every_human_readable_view_escapes_control_characters_and_json_keeps_the_text(alias: str) -> None:
    item = Item.objects.using(alias).create(name="x")
    pids: dict[str, int] = {}
    holding, release = threading.Event(), threading.Event()
    holder = in_thread(_hold, alias, item.pk, pids, holding, release)
    try:
        assert holding.wait(30)
        waiter = in_thread(_wait, alias, item.pk)
        wait_until_blocked(pids["holder"], using=alias, contenders=waiter)
        # MariaDB shows no statement for an idle holder: its escapes are PostgreSQL's to show.
        shows_holder = alias == "default"
        _assert_escaped(_run("--database", alias), holder=shows_holder)
        _assert_escaped(_run("--database", alias, "--expanded"), holder=shows_holder)
        _assert_escaped(
            _run("--database", alias, "--min-wait", "0", str(pids["holder"])), holder=shows_holder
        )
        if shows_holder:
            blocking = _run("--database", alias, "--blocking")
            assert "\\x1b]0;owned\\x07" in blocking
            assert not any(char in blocking for char in RAW)
        # The confirmation lists the session it would signal, escaped too; "n" signals nothing.
        waiting_pid = next(w.waiting.pid for w in lockkit.inspection.blocking(alias))
        with pytest.raises(CommandError, match="aborted: nothing was signalled"):
            _run("--database", alias, "--terminate", str(waiting_pid), stdin="n\n")
        out = io.StringIO()
        with pytest.raises(CommandError):
            call_command(
                "lockkit_locks",
                "--database",
                alias,
                "--cancel",
                str(waiting_pid),
                stdout=out,
                stdin=io.StringIO(""),
            )
        _assert_escaped(out.getvalue(), holder=False)

        # --json: the real text, every control character JSON-escaped by json.dumps.
        document = _run("--database", alias, "--json")
        for char in RAW:
            assert char not in document
        (wait,) = json.loads(document)
        assert ESCAPE in wait["waiting"]["query"]
        if shows_holder:
            assert HOLDER_ESCAPE in wait["blocking"][0]["query"]
        blockers = json.loads(_run("--database", alias, "--json", "--blocking"))
        assert [blocker["session"]["pid"] for blocker in blockers] == [pids["holder"]]
    finally:
        release.set()
    assert holder.outcome(timeout=30).error is None
    assert waiter.outcome(timeout=30).error is None


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b[31mb", "a\\x1b[31mb"),
        ("bell\x07 del\x7f csi\x9b", "bell\\x07 del\\x7f csi\\x9b"),
        ("right\u202eto-left \u200b", "right\\u202eto-left \\u200b"),
        ("tab\tcr\rnl\n", "tab\\x09cr\\x0dnl\\x0a"),
        ("plain [markup] \\x1b é 漢", "plain [markup] \\x1b é 漢"),
    ],
)
def test_printable_escapes_control_and_format_characters(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable("a\nb\x1b", keep_newlines=True) == "a\nb\\x1b"


def _other_database_advisory(
    pids: dict[str, int], name: str, holding: threading.Event, release: threading.Event
) -> None:
    with lockkit.advisory_lock("cross-database-key", using="other", lock_timeout=30) as held:
        assert held.pid is not None
        pids[name] = held.pid
        holding.set()
        release.wait(30)


@pytest.mark.contention
@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_the_sessions_and_locks_of_another_database_are_not_listed() -> None:
    pids: dict[str, int] = {}
    holding, release, never = threading.Event(), threading.Event(), threading.Event()
    holder = in_thread(_other_database_advisory, pids, "holder", holding, release)
    try:
        assert holding.wait(30)
        never.set()
        waiter = in_thread(_other_database_advisory, pids, "waiter", threading.Event(), never)
        wait_until_blocked(pids["holder"], using="other", contenders=waiter)
        # Real on the other database...
        assert [w.lock_kind for w in lockkit.inspection.blocking("other")] == ["advisory"]
        # ...and absent from the default database's listing, in every view.
        assert lockkit.inspection.blocking("default") == []
        for args in ((), ("--blocking",), ("--expanded",)):
            out = _run("--database", "default", *args)
            assert str(pids["holder"]) not in out, out
            assert "advisory" not in out
        assert json.loads(_run("--database", "default", "--json")) == []
        assert json.loads(_run("--database", "default", "--json", "--blocking")) == []
    finally:
        release.set()
    assert holder.outcome(timeout=30).error is None
    assert waiter.outcome(timeout=30).error is None


SECRET = "/* another database's secret */"


def _lock_shared_catalog(
    alias: str, mode: str, pids: dict[str, int], holding: threading.Event, release: threading.Event
) -> None:
    # pg_replication_origin: a shared catalog nothing else here uses (not touched by CREATE/DROP DATABASE).
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', '20s', true)")
        pids[alias] = backend_pid(alias)
        holding.set()
        cursor.execute(
            f"LOCK TABLE pg_catalog.pg_replication_origin IN {mode} MODE {SECRET if alias == 'other' else ''}"
        )
        release.wait(30)


@pytest.mark.contention
@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_blocker_of_another_database_is_named_by_its_pid_only() -> None:
    pids: dict[str, int] = {}
    held, release = threading.Event(), threading.Event()
    holder = in_thread(_lock_shared_catalog, "other", "ACCESS EXCLUSIVE", pids, held, release)
    try:
        assert held.wait(30)
        waiting_started = threading.Event()
        waiter = in_thread(_lock_shared_catalog, "default", "ACCESS SHARE", pids, waiting_started, release)
        wait_until_blocked(pids["other"], using="default", contenders=waiter)
        (wait,) = lockkit.inspection.blocking("default")
        assert wait.waiting.pid == pids["default"]
        (blocker,) = wait.blocking
        # Only the pid: not its query, user or application.
        assert blocker.pid == pids["other"]
        assert (blocker.query, blocker.user, blocker.application_name, blocker.state) == (
            None,
            None,
            None,
            OTHER_DATABASE,
        )
        for args in ((), ("--blocking",), ("--expanded",), ("--json",)):
            out = _run("--database", "default", *args)
            assert "another database's secret" not in out, out
            assert str(pids["other"]) in out
        # And it cannot be signalled from this alias.
        with pytest.raises(CommandError, match="another database"):
            _run("--database", "default", "--terminate", str(pids["other"]), "--no-input")
    finally:
        release.set()
    assert holder.outcome(timeout=30).error is None
    assert waiter.outcome(timeout=30).error is None


@pytest.mark.contention
@pytest.mark.parametrize("alias", vendor_params()[1:])  # MariaDB: a session of another database locks our row
def test_a_mariadb_blocker_using_another_database_is_named_by_its_id_only(alias: str) -> None:
    item = Item.objects.using(alias).create(name="x")
    stranger = connections.create_connection(alias)
    try:
        quote = stranger.ops.quote_name
        table = f"{quote(stranger.settings_dict['NAME'])}.{quote(Item._meta.db_table)}"
        with stranger.cursor() as cursor:
            cursor.execute("USE information_schema")
            cursor.execute("SELECT CONNECTION_ID()")
            (stranger_pid,) = cursor.fetchone()
        stranger.set_autocommit(False)
        with stranger.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE {SECRET}", [item.pk])
        waiter = in_thread(_wait, alias, item.pk)
        wait_until_blocked(int(stranger_pid), using=alias, contenders=waiter)
        (wait,) = lockkit.inspection.blocking(alias)
        (blocker,) = wait.blocking
        assert (blocker.pid, blocker.query, blocker.user, blocker.state) == (
            stranger_pid,
            None,
            None,
            OTHER_DATABASE,
        )
        for args in ((), ("--blocking",), ("--expanded",), ("--json",)):
            out = _run("--database", alias, *args)
            assert "another database's secret" not in out, out
            assert str(stranger_pid) in out
        stranger.rollback()
        assert waiter.outcome(timeout=30).error is None
    finally:
        stranger.close()
