"""A connection inherited across ``fork()`` is never shared with the child (issue 23, item 9).

Real forks: the parent opens its connection, forks, the child queries and closes its connections, exits; the
parent's session is the same one, still alive, and its next call works.
"""

from __future__ import annotations

import json
import os

import pytest
from django.db import connections

import lockkit
from lockkit.testing import backend_pid
from lockkit_tests.models import Stock
from lockkit_tests.support.vendors import vendor_params

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "mariadb"]),
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
]
BOTH = vendor_params()


def _in_child(alias: str) -> dict[str, object]:
    """Fork; in the child, reserve one widget with lockkit and close every connection; return what it saw."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        code = 1
        try:
            os.close(read)
            with lockkit.locked(alias) as scope:
                row = scope.get(Stock, pk="widget")
                row.available -= 1
                row.save(using=alias)
            seen = {"pid": backend_pid(alias), "left": Stock.objects.using(alias).get().available}
            connections.close_all()  # closing in the child must not end the parent's session
            os.write(write, json.dumps(seen).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed"
    report: dict[str, object] = json.loads(text)
    return report


@pytest.mark.parametrize("alias", BOTH)
def test_a_forked_child_gets_its_own_session_and_the_parents_survives(alias: str) -> None:
    Stock.objects.using(alias).create(sku="widget", available=5)
    parent_session = backend_pid(alias)  # the parent's connection is open when it forks
    child = _in_child(alias)
    assert child["pid"] != parent_session  # a session of its own, not the inherited socket
    assert child["left"] == 4
    assert (
        backend_pid(alias) == parent_session
    )  # the parent's session was neither used nor closed by the child
    with lockkit.locked(alias) as scope:  # and the parent's next call works on it
        row = scope.get(Stock, pk="widget")
        assert row.available == 4
        row.available -= 1
        row.save(using=alias)
    assert Stock.objects.using(alias).get().available == 3
    assert backend_pid(alias) == parent_session


@pytest.mark.parametrize("alias", BOTH)
def test_a_connection_opened_inside_a_scope_before_the_fork_is_the_parents_only(alias: str) -> None:
    Stock.objects.using(alias).create(sku="widget", available=5)
    with lockkit.locked(alias) as scope:
        scope.get(Stock, pk="widget")
        parent_session = backend_pid(alias)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read)
                # The transaction is the parent's: the child cannot continue it (nor read its replies).
                try:
                    Stock.objects.using(alias).get()
                    outcome = "read through the parent's session"
                except Exception as exc:
                    outcome = type(exc).__name__
                os.write(write, outcome.encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as pipe:
            seen = pipe.read()
        os.waitpid(pid, 0)
        assert backend_pid(alias) == parent_session  # still inside its own transaction, same session
        row = scope.get(Stock, pk="widget")
        row.available -= 1
        row.save(using=alias)
    assert seen in {"TransactionManagementError", "InterfaceError", "OperationalError"}
    assert Stock.objects.using(alias).get().available == 4  # the parent's transaction committed
