"""Lock inspection: a three-session chain (holder -> waiter -> waiter) seen by ``lockkit.inspection.blocking()`` and
``manage.py lockkit_locks``, unblocked by ``--cancel``; signals refused for sessions of other databases."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import NotSupportedError, OperationalError, connections

import lockkit.inspection
from lockkit import locked
from lockkit.backends.waits import LockWait, Session
from lockkit.testing import backend_pid, hold_lock, in_thread, wait_until_blocked
from lockkit_tests.models import Item
from lockkit_tests.support.vendors import vendor_params

BOTH = vendor_params()


def _chain_member(alias: str, first: int, then: int, pids: dict[str, int], name: str) -> str:
    """Lock row ``first``, publish this session's id, then wait for row ``then``; return what it read."""
    with locked(alias, lock_timeout=30) as scope:
        scope.get(Item, pk=first)
        if connections[alias].vendor == "postgresql":
            # Session-level on purpose: the thread's connection is closed when it ends.
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT set_config('application_name', %s, false)", [f"lockkit-waiter-{name}"])
        pids[name] = backend_pid(alias)
        return scope.get(Item, pk=then).name


def _wait_for_row(alias: str, pk: int) -> str:
    with locked(alias, lock_timeout=30) as scope:
        return scope.get(Item, pk=pk).name


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("lockkit_locks", *args, stdout=out)
    return out.getvalue()


@pytest.mark.contention
@pytest.mark.parametrize("alias", BOTH)
def test_a_three_session_chain_is_reported_and_cancel_unblocks_it(alias: str) -> None:
    first = Item.objects.using(alias).create(name="first")
    second = Item.objects.using(alias).create(name="second")
    pids: dict[str, int] = {}
    with hold_lock(first) as holder:
        # waiter A holds `second` and waits for `first` (held by the holder); waiter B waits for `second`.
        waiter_a = in_thread(_chain_member, alias, second.pk, first.pk, pids, "a")
        wait_until_blocked(holder, contenders=waiter_a)
        waiter_b = in_thread(_wait_for_row, alias, second.pk)
        wait_until_blocked(pids["a"], using=alias, contenders=waiter_b)
        a, b = pids["a"], 0

        waits = lockkit.inspection.blocking(alias)
        by_waiter = {wait.waiting.pid: wait for wait in waits}
        assert len(by_waiter) == 2, waits
        b = next(pid for pid in by_waiter if pid != a)
        assert by_waiter[a].blocking_pids == (holder.pid,)
        assert by_waiter[a].chain == (holder.pid, a)
        assert by_waiter[b].blocking_pids == (a,)
        assert by_waiter[b].chain == (holder.pid, a, b)
        assert by_waiter[b].root_pid == holder.pid
        table = Item._meta.db_table
        for wait in waits:
            assert wait.alias == alias
            assert "FOR UPDATE" in (wait.waiting.query or "").upper()
            assert table in (wait.waiting.query or "")
            assert table in (wait.target or "")
            assert wait.waited_seconds is not None
            assert wait.waited_seconds >= 0
        if alias == "default":
            # PostgreSQL also names the idle holder's last query, and the application.
            assert table in (by_waiter[a].blocking[0].query or "")
            assert by_waiter[a].blocking[0].state == "idle in transaction"
            assert by_waiter[a].lock_kind == "transactionid"
            assert by_waiter[a].waiting.application_name == "lockkit-waiter-a"
            assert by_waiter[b].blocking[0].application_name == "lockkit-waiter-a"
        else:
            assert by_waiter[a].lock_kind == "RECORD"

        tree = _run("--database", alias)
        lines = tree.splitlines()
        assert "2 session(s) waiting" in lines[0]
        # Root first, then A under it, then B under A.
        order = [
            next(i for i, line in enumerate(lines) if f"pid {pid} " in line) for pid in (holder.pid, a, b)
        ]
        assert order == sorted(order), tree
        # Each session's line shows its query (a SELECT ... FOR UPDATE of the table); MariaDB has none for the
        # idle holder.
        for index in order if alias == "default" else order[1:]:
            assert "FOR UPDATE" in lines[index].upper(), lines[index]
            assert table in lines[index]
        assert "holds the lock" in lines[order[0]]
        assert "waits for" in lines[order[1]]
        report = json.loads(_run("--database", alias, "--json"))
        assert sorted(tuple(item["chain"]) for item in report) == [(holder.pid, a), (holder.pid, a, b)]
        watched = _run("--database", alias, "--json", "--watch", "0.01", "--count", "2").splitlines()
        assert len(watched) == 2

        # Cancelling A's statement fails A's scope, which rolls back and releases `second`: B proceeds.
        said = _run("--database", alias, "--cancel", str(a), "--no-input")
        assert f"cancelled the statement of session {a}" in said
        outcome_a = waiter_a.outcome(timeout=30)
        assert isinstance(outcome_a.error, OperationalError), outcome_a
        assert waiter_b.result(timeout=30) == "second"
        assert holder.pid not in {wait.waiting.pid for wait in lockkit.inspection.blocking(alias)}
    assert lockkit.inspection.blocking(alias) == []


@pytest.mark.parametrize("alias", vendor_params("other"))
def test_signals_refuse_sessions_of_other_databases(alias: str) -> None:
    # A session of another database on the same server: PostgreSQL's "other" alias; a MariaDB session that
    # switched to information_schema.
    stranger = connections.create_connection("other" if alias == "default" else alias)
    try:
        if alias != "default":
            with stranger.cursor() as cursor:
                cursor.execute("USE information_schema")
        stranger_pid = _stranger_pid(alias, stranger)
        for flag in ("--cancel", "--terminate"):
            with pytest.raises(CommandError, match="another database") as caught:
                _run("--database", alias, flag, str(stranger_pid), "--no-input")
            assert "nothing was signalled" in str(caught.value)
        # Still alive: nothing was signalled.
        assert _stranger_pid(alias, stranger) == stranger_pid
        with pytest.raises(CommandError, match="no session"):
            _run("--database", alias, "--cancel", "2000000000", "--no-input")
    finally:
        stranger.close()


def _stranger_pid(alias: str, connection: Any) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()" if alias == "default" else "SELECT CONNECTION_ID()")
        return int(cursor.fetchone()[0])


@pytest.mark.contention
@pytest.mark.parametrize("alias", BOTH)
def test_terminate_releases_the_holder(alias: str) -> None:
    item = Item.objects.using(alias).create(name="held")
    holding, released = threading.Event(), threading.Event()
    pids: dict[str, int] = {}

    def hold() -> None:
        with locked(alias, lock_timeout=30) as scope:
            scope.get(Item, pk=item.pk)
            pids["holder"] = backend_pid(alias)
            holding.set()
            released.wait(30)
            scope.get(Item, pk=item.pk)  # the terminated session fails here

    holder = in_thread(hold)
    try:
        assert holding.wait(30)
        waiter = in_thread(_wait_for_row, alias, item.pk)
        wait_until_blocked(pids["holder"], using=alias, contenders=waiter)
        signalled = lockkit.inspection.terminate(pids["holder"], using=alias)
        assert signalled.sent
        assert str(signalled).startswith(f"terminated session {pids['holder']}")
        assert waiter.result(timeout=30) == "held"
    finally:
        released.set()
    assert holder.outcome(timeout=30).error is not None


def test_chains_follow_the_waiting_blocker_and_stop_at_cycles() -> None:
    def wait(pid: int, *blockers: int) -> LockWait:
        return LockWait("default", Session(pid), tuple(Session(b) for b in blockers), "advisory")

    waits = lockkit.inspection.with_chains([wait(3, 1, 2), wait(2, 1), wait(5, 6), wait(6, 5)])
    chains = {w.waiting.pid: w.chain for w in waits}
    assert chains[2] == (1, 2)
    assert chains[3] == (1, 2, 3)  # behind 2, which is itself queued behind 1
    assert chains[5] == (6, 5)  # a deadlock's cycle ends the chain
    assert [s.pid for s in lockkit.inspection.roots(waits)] == [1]


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_inspection_refuses_sqlite() -> None:
    with pytest.raises(NotSupportedError, match="lock inspection is not supported on sqlite"):
        lockkit.inspection.blocking("sqlite")
    with pytest.raises(CommandError, match="not supported on sqlite"):
        _run("--database", "sqlite")


@pytest.mark.parametrize(("pid", "error"), [(True, TypeError), ("12", TypeError), (0, ValueError)])
def test_signal_arguments_are_checked_before_any_sql(pid: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="pid"):
        lockkit.inspection.cancel(pid)
