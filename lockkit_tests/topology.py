"""Throwaway servers for the topology tests: a PostgreSQL primary, a hot standby streaming from it, and a
PgBouncer in transaction pooling mode in front of the primary.

Ports are picked when the settings are imported (``PORTS``), so the aliases ``primary``, ``replica`` and
``pgbouncer`` exist in ``DATABASES`` from the start; the servers start only when a collected test uses one of
those aliases (``servers_for(items)``, from the session fixture ``django_db_modify_db_settings``) and stop
at the end of the session. Everything runs from temporary directories under this process's control, as the
``postgres`` OS user when the tests run as root (``initdb`` and PgBouncer refuse root). ``missing()`` says why
the topology cannot run here.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lockkit_harness.cluster import (
    PG_BIN,
    PGBOUNCER,
    as_postgres,
    free_port,
    owned_tempdir,
)
from lockkit_harness.cluster import run as _run
from lockkit_harness.cluster import wait_for_port as _wait_for_port

ALIASES = ("primary", "replica", "pgbouncer")
# The test database pytest-django creates on the primary; the replica and PgBouncer aliases mirror it.
PRIMARY_DB = "lockkit_topology"


def missing() -> str | None:
    """Return why the topology cannot run on this machine, or ``None`` when it can."""
    needed = [PG_BIN / name for name in ("initdb", "pg_ctl", "pg_basebackup", "postgres")]
    absent = [str(path) for path in needed if not os.access(path, os.X_OK)]
    if not os.access(PGBOUNCER, os.X_OK):
        absent.append("pgbouncer (apt-get install pgbouncer)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            absent.append("an OS user 'postgres' to run PostgreSQL as (running as root)")
    return f"missing {', '.join(absent)}" if absent else None


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


class Topology:
    """The running servers; ``stop()`` stops them and removes their directories."""

    def __init__(self) -> None:
        self.root = owned_tempdir("lockkit-topology-")
        self.primary = self.root / "primary"
        self.replica = self.root / "replica"
        self.started: list[Path] = []
        self.bouncer: subprocess.Popen[bytes] | None = None

    def _pg_ctl_start(self, data: Path, port: int) -> None:
        options = (
            f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
            "-c fsync=off -c deadlock_timeout=100ms -c shared_buffers=16MB -c max_connections=40"
        )
        _run(
            [str(PG_BIN / "pg_ctl"), "start", "-w", "-D", str(data), "-l", str(data) + ".log", "-o", options]
        )
        self.started.append(data)

    def start(self) -> None:
        _run(
            [str(PG_BIN / "initdb"), "-D", str(self.primary), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        )
        self._pg_ctl_start(self.primary, PORTS["primary"])
        _run(
            [
                str(PG_BIN / "pg_basebackup"),
                "-D",
                str(self.replica),
                "-h",
                "127.0.0.1",
                "-p",
                str(PORTS["primary"]),
                "-U",
                "postgres",
                "-X",
                "stream",
                "-R",  # standby.signal and primary_conninfo: a streaming hot standby
            ]
        )
        self._pg_ctl_start(self.replica, PORTS["replica"])
        self._start_pgbouncer()

    def _start_pgbouncer(self) -> None:
        ini = self.root / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={PORTS['primary']} user=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {PORTS['pgbouncer']}\n"
            f"unix_socket_dir = {self.root}\n"
            "auth_type = any\n"
            "pool_mode = transaction\n"
            # Two server connections: enough for two contending sessions, few enough that clients reuse them.
            "default_pool_size = 2\nreserve_pool_size = 0\nmax_client_conn = 100\n"
            "server_reset_query =\n"  # transaction pooling never runs it; said explicitly
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
        )
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(ini, entry.pw_uid, entry.pw_gid)
        self.bouncer = subprocess.Popen(
            [*as_postgres(), PGBOUNCER, str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_for_port(PORTS["pgbouncer"], "PgBouncer")

    def stop_pgbouncer(self) -> None:
        """Stop PgBouncer, which closes its server connections (the test database can then be dropped)."""
        if self.bouncer is None:
            return
        self.bouncer.terminate()
        try:
            self.bouncer.wait(10)
        except subprocess.TimeoutExpired:
            self.bouncer.kill()
            self.bouncer.wait(10)
        self.bouncer = None

    def stop(self) -> None:
        self.stop_pgbouncer()
        for data in reversed(self.started):
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                _run([str(PG_BIN / "pg_ctl"), "stop", "-D", str(data), "-m", "immediate", "-w"])
        shutil.rmtree(self.root, ignore_errors=True)


def _uses_topology(items: Iterable[Any]) -> bool:
    for item in items:
        marker = item.get_closest_marker("django_db")
        databases = marker.kwargs.get("databases", ()) if marker is not None else ()
        if databases == "__all__" or set(databases) & set(ALIASES):
            return True
    return False


@contextlib.contextmanager
def servers_for(items: Iterable[Any]) -> Iterator[None]:
    """Run the topology servers while the session lasts, when a collected test uses one of their aliases."""
    if not PORTS or not _uses_topology(items):
        yield
        return
    global _running
    topology = Topology()
    try:
        _running = topology
        topology.start()
        yield
    finally:
        _running = None
        topology.stop()


_running: Topology | None = None


def stop_pgbouncer() -> None:
    """Stop the session's PgBouncer once the tests that use it are done (its server connections would
    otherwise keep the test database from being dropped)."""
    if _running is not None:
        _running.stop_pgbouncer()


def wait_for_replay(timeout: float = 10.0) -> None:
    """Wait until the standby has replayed everything the primary has written so far (WAL positions are per
    cluster, so this also covers a database created after the standby started)."""
    import psycopg

    def connect(alias: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host="127.0.0.1", port=PORTS[alias], user="postgres", dbname="postgres", autocommit=True
        )

    with connect("primary") as primary, connect("replica") as replica:
        row = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        deadline = time.monotonic() + timeout
        while True:
            done = replica.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [row[0]]).fetchone()
            if done is not None and done[0]:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the replica did not replay up to {row[0]} within {timeout}s")
            time.sleep(0.01)


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
