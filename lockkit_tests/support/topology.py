"""The topology tests' Django glue: the aliases ``primary``, ``replica`` and ``pgbouncer`` of a PostgreSQL primary,
its hot standby and a PgBouncer in transaction pooling mode in front of the primary.

The servers are ``lockkit_harness.cluster.Topology``'s. Their ports are picked when the settings are imported
(``PORTS``), so the aliases exist in ``DATABASES`` from the start; the servers start only when a collected test uses
one of those aliases (``servers_for(items)``, from the session fixture ``django_db_modify_db_settings``) and stop at
the end of the session. ``missing()`` says why the topology cannot run here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from lockkit_harness.cluster import Topology, free_port, missing_binaries

ALIASES = ("primary", "replica", "pgbouncer")
# The test database pytest-django creates on the primary; the replica and PgBouncer aliases mirror it.
PRIMARY_DB = "lockkit_topology"
# Durable commits on the primary (the harness's default is synchronous_commit=off), small servers.
SERVER_SETTINGS = {
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "shared_buffers": "16MB",
    "max_connections": "40",
}
PGBOUNCER_SETTINGS = {
    # Two server connections: enough for two contending sessions, few enough that clients reuse them.
    "default_pool_size": "2",
    "reserve_pool_size": "0",
    "server_reset_query": "",  # transaction pooling never runs it; said explicitly
}


def missing() -> str | None:
    """Return why the topology cannot run on this machine, or ``None`` when it can."""
    return missing_binaries(pgbouncer=True, standby=True)


PORTS: dict[str, int] = {alias: free_port() for alias in ALIASES} if missing() is None else {}


def database_settings() -> dict[str, dict[str, Any]]:
    """The ``DATABASES`` entries of the topology aliases (empty when ``missing()``)."""
    if not PORTS:
        return {}
    base: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "127.0.0.1",
        "USER": "postgres",
        "NAME": PRIMARY_DB,
        "CONN_MAX_AGE": 0,
    }
    return {
        "primary": {**base, "PORT": PORTS["primary"]},
        "replica": {**base, "PORT": PORTS["replica"], "TEST": {"MIRROR": "primary"}},
        "pgbouncer": {
            **base,
            "PORT": PORTS["pgbouncer"],
            "TEST": {"MIRROR": "primary"},
            # Transaction pooling: no server-side cursors, no prepared statements (PgBouncer < 1.21).
            "DISABLE_SERVER_SIDE_CURSORS": True,
            "OPTIONS": {"prepare_threshold": None},
        },
    }


def _uses_topology(items: Iterable[Any]) -> bool:
    for item in items:
        marker = item.get_closest_marker("django_db")
        databases = marker.kwargs.get("databases", ()) if marker is not None else ()
        if databases == "__all__" or set(databases) & set(ALIASES):
            return True
    return False


_running: Topology | None = None


@contextlib.contextmanager
def servers_for(items: Iterable[Any]) -> Iterator[None]:
    """Run the topology servers while the session lasts, when a collected test uses one of their aliases."""
    global _running
    if not PORTS or not _uses_topology(items):
        yield
        return
    topology = Topology(
        primary_port=PORTS["primary"],
        replica_port=PORTS["replica"],
        pgbouncer_port=PORTS["pgbouncer"],
        settings=SERVER_SETTINGS,
        pgbouncer_settings=PGBOUNCER_SETTINGS,
    )
    try:
        _running = topology
        topology.start()
        yield
    finally:
        _running = None
        topology.stop()


def stop_pgbouncer() -> None:
    """Stop the session's PgBouncer once the tests that use it are done (its server connections would
    otherwise keep the test database from being dropped)."""
    if _running is not None:
        _running.stop_pgbouncer()


def wait_for_replay(timeout: float = 10.0) -> None:
    """Wait until the session's standby has replayed everything its primary has written so far."""
    if _running is None:
        raise RuntimeError("the topology servers are not running (no collected test uses their aliases)")
    _running.wait_for_replay(timeout)


class PrimaryReplicaRouter:
    """Reads go to the hot standby, writes to the primary (the usual read-replica router)."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str:
        return "replica"

    def db_for_write(self, model: type[Any], **hints: Any) -> str:
        return "primary"

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool:
        return db == "primary"
