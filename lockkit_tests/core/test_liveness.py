"""A dead connection is discarded before the next call (``lockkit._engine.liveness``), whatever came before it.

lockkit checks a connection only after Django recorded an error on it, and remembers the driver connection it last
found usable so that it checks each one once. That memory must never be taken for a newer driver connection: on
CPython a new connection object is often given the address (the ``id()``) of one freed just before (14 of 20
reconnects on Python 3.13 here), and a connection the server then ended went unchecked, so the call after the one
that lost it failed too.
"""

from __future__ import annotations

import gc

import pytest
from django.db import OperationalError, ProgrammingError, connections

from lockkit._engine import liveness
from lockkit_harness import sessions

pytestmark = pytest.mark.django_db(transaction=True)

# Reconnects tried until the new driver connection has the address of the one checked before it: 1 or 2 on
# Python 3.13 without the fix. With it, the checked connection is still referenced, its address never given again,
# and every try is made (about 45 ms each).
_TRIES = 20


def _fail_a_statement() -> None:
    """A statement refused by the server: Django records an error on the connection, which stays usable."""
    with pytest.raises(ProgrammingError), connections["default"].cursor() as cursor:
        cursor.execute("SELEC 1")


def test_a_connection_the_server_ended_is_discarded_though_an_earlier_one_had_its_address() -> None:
    connection = connections["default"]
    connection.close()
    for _ in range(_TRIES):
        connection.ensure_connection()
        _fail_a_statement()
        assert connection.errors_occurred
        liveness.discard_if_dead("default")  # usable: kept, and remembered as checked
        assert connection.connection is not None
        checked = id(connection.connection)
        connection.close()
        gc.collect()
        connection.ensure_connection()
        if id(connection.connection) == checked:
            break
    pid = sessions.session_of("default")
    assert sessions.terminate("default", pid)
    with pytest.raises(OperationalError), connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # sent into the ended session: Django records the error
    liveness.discard_if_dead("default")
    assert connection.connection is None  # discarded, not taken for the connection checked before
    with connection.cursor() as cursor:  # the next call connects anew and works
        cursor.execute("SELECT 41 + 1, pg_backend_pid()")
        answer, new_pid = cursor.fetchone()
    assert (answer, new_pid != pid) == (42, True)


def test_a_usable_connection_is_checked_once_per_driver_connection() -> None:
    connection = connections["default"]
    connection.ensure_connection()
    _fail_a_statement()
    first = connection.connection
    liveness.discard_if_dead("default")
    liveness.discard_if_dead("default")
    assert connection.connection is first  # found usable: kept
    with connection.cursor() as cursor:
        cursor.execute("SELECT 42")
        assert cursor.fetchone() == (42,)
