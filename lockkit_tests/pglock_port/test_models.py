"""django-pglock's ``tests/test_models.py`` on ``lockkit.inspection``: pglock's ``PGLock``/``BlockedPGLock``
querysets cancel or terminate the sessions they select; lockkit signals one session by id (``cancel()``,
``terminate()``) and finds the blockers with ``blocking()`` (and ``lockkit_locks --blocking``).
"""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import OperationalError, connections

import lockkit.inspection
from lockkit import locked
from lockkit.errors import ConnectionLost, QueryCanceled
from lockkit.management.locks_options import blockers
from lockkit.testing import backend_pid, hold_lock, in_thread, wait_until_blocked
from lockkit_tests.models import Item
from lockkit_tests.support.vendors import vendor_params

BOTH = vendor_params()


@pytest.mark.parametrize("alias", BOTH)
def test_activity_management(alias: str) -> None:
    """Ports pglock's ``test_activity_management``: ``PGLock.objects.terminate_activity()`` inside a transaction
    signals the caller's own session, and the transaction fails with ``OperationalError``.

    lockkit: terminating the session of one's own ``locked()`` scope makes its next statement fail with
    ``ConnectionLost`` (an ``OperationalError``), and the connection is usable again afterwards. pglock's
    ``cancel_activity()`` cancels the very statement that sends it; lockkit signals from a connection of its own,
    so the nearest equivalent is cancelling a statement of the caller's session while it runs (below, from
    another thread: ``QueryCanceled``).
    """
    item = Item.objects.using(alias).create(name="x")
    with pytest.raises(OperationalError) as caught, locked(alias, lock_timeout=5) as scope:
        scope.get(Item, pk=item.pk)
        own = backend_pid(alias)
        assert lockkit.inspection.terminate(own, using=alias).sent
        scope.get(Item, pk=item.pk)
    assert isinstance(caught.value, ConnectionLost)
    # The next call on the alias works: lockkit discarded the dead connection.
    with locked(alias, lock_timeout=5) as scope:
        assert scope.get(Item, pk=item.pk).name == "x"
        assert backend_pid(alias) != own

    with hold_lock(item) as holder:
        pids: dict[str, int] = {}

        def wait_for_the_row() -> str:
            with locked(alias, lock_timeout=30) as scope:
                pids["self"] = backend_pid(alias)
                return scope.get(Item, pk=item.pk).name

        waiter = in_thread(wait_for_the_row)
        wait_until_blocked(holder, contenders=waiter)
        assert lockkit.inspection.cancel(pids["self"], using=alias).sent
        assert isinstance(waiter.outcome(timeout=30).error, QueryCanceled)


@pytest.mark.parametrize("alias", BOTH)
def test_blocking_activity_management(alias: str) -> None:
    """Ports pglock's ``test_blocking_activity_management``: with nothing blocked,
    ``BlockedPGLock.objects.cancel_blocking_activity()``/``terminate_blocking_activity()`` select no session and
    signal nothing.

    lockkit: ``blocking()`` is empty and so are its blockers (``lockkit_locks --blocking``); better, with a real
    blocked session, cancelling the blocker ``blockers()`` names unblocks the waiter.
    """
    assert lockkit.inspection.blocking(alias) == []
    assert blockers([]) == []
    out = io.StringIO()
    call_command("lockkit_locks", "--database", alias, "--blocking", "--json", stdout=out)
    assert json.loads(out.getvalue()) == []

    item = Item.objects.using(alias).create(name="x")
    pids: dict[str, int] = {}

    def hold_then_read() -> str:
        with locked(alias, lock_timeout=30) as scope:
            scope.get(Item, pk=item.pk)
            pids["holder"] = backend_pid(alias)
            # Waits in the database until the test cancels it: the blocker runs a long statement.
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT pg_sleep(60)" if alias == "default" else "SELECT SLEEP(60)")
            return "slept"

    holder = in_thread(hold_then_read)
    try:
        holder_pid = _wait_for(pids, "holder")  # it holds the row from here on
        waiter = in_thread(_read, alias, item.pk)
        wait_until_blocked(holder_pid, using=alias, contenders=waiter)
        (found,) = blockers(lockkit.inspection.blocking(alias))
        assert found.session.pid == pids["holder"]
        assert lockkit.inspection.cancel(found.session.pid, using=alias).sent
        assert waiter.result(timeout=30) == "x"
    finally:
        if not holder.join(30):
            holder.cancel_statements()
            holder.join(30)
    outcome = holder.outcome(timeout=30)
    # The cancelled statement fails (PostgreSQL 57014, MariaDB 1317), and so its scope, which rolled back.
    assert isinstance(outcome.error, QueryCanceled), outcome


def _read(alias: str, pk: int) -> str:
    with locked(alias, lock_timeout=30) as scope:
        return scope.get(Item, pk=pk).name


def _wait_for(pids: dict[str, int], name: str) -> int:
    """The pid a thread publishes (it does so before its long statement); bounded."""
    import time

    deadline = time.monotonic() + 30
    while name not in pids:
        assert time.monotonic() < deadline, f"{name} never started"
        time.sleep(0.005)
    return pids[name]
