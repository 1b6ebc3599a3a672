"""A real PgBouncer in transaction pooling mode in front of PostgreSQL (two server connections in all).

lockkit's timeouts are transaction-scoped (``set_config(..., true)``), so they apply inside the scope and
never reach the next client that gets the same server connection; locked operations and retries behave as
without a pooler.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connections

import lockkit
from lockkit_tests.support import topology

MISSING = topology.missing()
ALIAS = "pgbouncer"
JOIN = 30.0

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=f"no PgBouncer topology: {MISSING}"),
    pytest.mark.django_db(transaction=True, databases=["default", "primary", ALIAS]),
]


def bouncer_client() -> psycopg.Connection[Any]:
    """Another PgBouncer client; not autocommit, so its first query opens a transaction and keeps a server."""
    settings = connections[ALIAS].settings_dict
    return psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        dbname=settings["NAME"],
        prepare_threshold=None,
    )


def every_server_connection() -> dict[int, tuple[str, str]]:
    """``{backend pid: (lock_timeout, statement_timeout)}`` of every pooled server connection (new clients).

    Two clients each open a transaction at the same time, so between them they hold both server connections.
    """
    clients = [bouncer_client(), bouncer_client()]
    try:
        seen: dict[int, tuple[str, str]] = {}
        for client in clients:
            row = client.execute(
                "SELECT pg_backend_pid(), current_setting('lock_timeout'), "
                "current_setting('statement_timeout')"
            ).fetchone()
            assert row is not None
            seen[row[0]] = (row[1], row[2])
        return seen
    finally:
        for client in clients:
            client.rollback()
            client.close()


def show(name: str) -> str:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT current_setting(%s)", [name])
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


def test_scope_timeouts_apply_inside_and_never_reach_the_next_client_of_the_server_connection() -> None:
    with lockkit.locked(ALIAS, lock_timeout=0.25, statement_timeout=3) as scope:
        assert scope.alias == ALIAS
        assert (show("lock_timeout"), show("statement_timeout")) == ("250ms", "3s")
        with connections[ALIAS].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (server_pid,) = cursor.fetchone()
    seen = every_server_connection()
    assert server_pid in seen  # another client got the very server connection the scope ran on...
    assert seen[server_pid] == ("0", "0")  # ...with the server defaults, not the scope's values
    with pytest.raises(ZeroDivisionError), lockkit.locked(ALIAS, lock_timeout=0.25, statement_timeout=3):
        _ = 1 / 0
    assert set(every_server_connection().values()) == {("0", "0")}  # after a failed scope too

    # The control: a session-level SET (what lockkit avoids) does reach the next client of that connection.
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid(), set_config('lock_timeout', '1234ms', false)")
        (leaky_pid, _) = cursor.fetchone()
    try:
        assert every_server_connection()[leaky_pid] == ("1234ms", "0")
    finally:
        with connections["primary"].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [leaky_pid])  # do not leave it to later tests


def test_a_session_advisory_lock_through_transaction_pooling_is_reported_lost() -> None:
    """PgBouncer hands out a server connection per transaction: a session-level lock stays on the server connection
    that took it, which the next client gets, while the block's own release lands elsewhere."""
    client = bouncer_client()
    held_pid = 0
    try:
        with pytest.raises(lockkit.AdvisoryLockLost, match="pooler") as caught:
            with lockkit.advisory_lock("cron:pooled", using=ALIAS, session=True) as held:
                assert held.pid is not None
                held_pid = held.pid
                # PgBouncer reuses the server connection released last: the one holding the lock.
                row = client.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                assert row[0] == held_pid
        assert caught.value.alias == ALIAS
    finally:
        client.rollback()
        client.close()
        if held_pid:
            with connections["primary"].cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [held_pid])  # drop the stranded lock
