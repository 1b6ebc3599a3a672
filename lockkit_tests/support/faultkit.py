"""Helpers of the fault tests: extra aliases (through a cutting proxy, on a restartable cluster, behind a
PgBouncer), waiting for a server to have closed a session, and for a transaction's final status.

An extra alias is registered with Django at run time (``connections.settings``) as a copy of an existing one
with another host and port, and removed afterwards; the tables it needs are created with the schema editor when
it points at a server of its own.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections, models

from lockkit_harness.cluster import PgBouncer, missing_binaries
from lockkit_harness.proxy import FaultProxy, Protocol
from lockkit_harness.sessions import session_of, terminate


@contextlib.contextmanager
def extra_alias(name: str, like: str, **overrides: Any) -> Iterator[str]:
    """Point alias ``name`` (declared in the test settings as a mirror) at ``like``'s database with
    ``overrides`` (``HOST``, ``PORT``, ``NAME``, ``OPTIONS``...) while the block runs; put it back after."""
    wrapper = connections[name]
    saved = copy.deepcopy(wrapper.settings_dict)
    wrapper.close()
    wrapper.settings_dict.update(copy.deepcopy(connections[like].settings_dict))
    wrapper.settings_dict.update(overrides)
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):
            wrapper.close()
        wrapper.settings_dict.clear()
        wrapper.settings_dict.update(saved)


def upstream_of(alias: str) -> tuple[str, int] | str:
    """The address a proxy in front of ``alias``'s server connects to (a Unix socket path for a socket dir)."""
    settings = connections[alias].settings_dict
    vendor = connections[alias].vendor
    host = str(settings.get("HOST") or ("127.0.0.1" if vendor == "mysql" else "/var/run/postgresql"))
    port = int(settings.get("PORT") or (3306 if vendor == "mysql" else 5432))
    if host.startswith("/"):
        return f"{host}/.s.PGSQL.{port}"
    return (host, port)


@contextlib.contextmanager
def behind_pgbouncer(like: str, settings: dict[str, str], name: str = "bouncer") -> Iterator[str]:
    """An alias that reaches ``like``'s database through a PgBouncer in transaction mode with ``settings``
    (``lockkit_harness.cluster.PgBouncer``), started here and stopped after; skips without PgBouncer or a TCP server.
    """
    reason = missing_binaries(pgbouncer=True)
    if reason is not None:
        pytest.skip(f"no PgBouncer: {reason}")
    upstream = upstream_of(like)
    if isinstance(upstream, str):
        # The embedded server (Quick start) listens on a Unix socket of its own system user, which PgBouncer
        # (run as postgres) cannot reach: a client would queue in PgBouncer until the test timed out. The machine
        # PostgreSQL (TCP) runs these tests in CI.
        pytest.skip(
            "PgBouncer needs a TCP PostgreSQL here; the embedded server listens on a Unix socket only"
        )
    host, port = upstream
    with PgBouncer(host, port, settings) as bouncer:
        options = {"prepare_threshold": None, "sslmode": "disable"}
        with extra_alias(
            name, like, HOST="127.0.0.1", PORT=bouncer.port, OPTIONS=options, DISABLE_SERVER_SIDE_CURSORS=True
        ) as alias:
            yield alias


@contextlib.contextmanager
def proxied(like: str, name: str = "proxied") -> Iterator[tuple[str, FaultProxy]]:
    """An alias that reaches ``like``'s database through a ``FaultProxy``; yields ``(alias, proxy)``."""
    protocol: Protocol = "mysql" if connections[like].vendor == "mysql" else "postgresql"
    options = copy.deepcopy(connections[like].settings_dict.get("OPTIONS", {}))
    if protocol == "postgresql":
        options["sslmode"] = "disable"  # the proxy reads the protocol: no TLS
    with FaultProxy(upstream_of(like), protocol) as proxy:
        with extra_alias(name, like, HOST="127.0.0.1", PORT=proxy.port, OPTIONS=options) as alias:
            yield alias, proxy


@contextlib.contextmanager
def ended_at_first_statement(alias: str, at: int = 1) -> Iterator[list[int]]:
    """End ``alias``'s session right before the ``at``-th statement sent on it inside the block is executed.

    From another connection, waiting until the session is gone (``lockkit_harness.sessions.terminate``): the
    statement is sent into the ended session, after any check a call makes before it sends. Yields the ended
    session's id, once it was ended.
    """
    ended: list[int] = []
    seen = [0]

    def end_first(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        seen[0] += 1
        if not ended and seen[0] == at:
            ended.append(session_of(alias))
            assert terminate(alias, ended[0])
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(end_first):
        yield ended


def create_tables(alias: str, *model_classes: type[models.Model]) -> None:
    """Create the tables of ``model_classes`` on ``alias`` (a database of its own, outside migrations)."""
    with connections[alias].schema_editor() as editor:
        for model in model_classes:
            editor.create_model(model)
    connections[alias].close()


def wait_until_gone(alias: str, session: int, *, timeout: float = 15.0, poll: float = 0.05) -> None:
    """Return once the server of ``alias`` no longer lists session ``session`` (it closed the connection).

    The check runs on a separate connection. MariaDB closes an idle session after ``wait_timeout``; PgBouncer
    drops an idle client after ``client_idle_timeout``.
    """
    control = connections.create_connection(alias)
    sql = (
        "SELECT count(*) FROM information_schema.processlist WHERE id = %s"
        if control.vendor == "mysql"
        else "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            with control.cursor() as cursor:
                cursor.execute(sql, [session])
                row = cursor.fetchone()
            if row is not None and row[0] == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"session {session} on {alias!r} still open after {timeout}s")
            time.sleep(poll)
    finally:
        control.close()


def final_status(alias: str, xid: int | None, timeout: float = 10.0) -> str:
    """``pg_xact_status(xid)`` on ``alias`` once it is final (the server notices a closed connection asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_xact_status(%s::text::xid8)", [str(xid)])
            row = cursor.fetchone()
        assert row is not None
        if row[0] != "in progress" or time.monotonic() > deadline:
            return str(row[0])
        time.sleep(0.02)
