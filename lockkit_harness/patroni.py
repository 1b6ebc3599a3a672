"""A throwaway Patroni cluster: one etcd (v3 API) and two PostgreSQL nodes managed by Patroni, on loopback ports,
with synchronous replication; a switchover, a crash of the leader's machine, and waits on the cluster's own view.

Development only (the topology test ``lockkit_tests/topology/test_patroni.py``). The Debian packages ``patroni``
and ``etcd-server`` provide the programs; PostgreSQL comes from ``$LOCKKIT_TEST_PG_BIN`` (see ``cluster.py``). As
root, etcd and Patroni run as the ``postgres`` OS user. See https://patroni.readthedocs.io/en/latest/yaml_configuration.html
and https://patroni.readthedocs.io/en/latest/rest_api.html.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from lockkit_harness.cluster import PG_BIN, chown, free_port, missing_binaries, owned_tempdir

PATRONI = shutil.which("patroni") or "/usr/bin/patroni"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
START_TIMEOUT = 90.0
POLL = 0.1  # seconds between two looks at the cluster's state


def missing() -> str | None:
    """Why a Patroni cluster cannot be started here, or ``None`` when it can."""
    absent = [
        f"{path} (apt-get install patroni etcd-server)"
        for path in (PATRONI, ETCD)
        if not os.access(path, os.X_OK)
    ]
    servers = missing_binaries()
    if servers is not None:
        absent.append(servers.removeprefix("missing "))
    return f"missing {', '.join(absent)}" if absent else None


def _user_kwargs() -> dict[str, Any]:
    """``Popen`` arguments that run a program as ``postgres`` when this process is root."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam("postgres")
    return {
        "user": entry.pw_uid,
        "group": entry.pw_gid,
        "extra_groups": [],
        "env": {**os.environ, "HOME": entry.pw_dir, "USER": "postgres", "LOGNAME": "postgres"},
    }


def _until(condition: Callable[[], Any], what: str, timeout: float) -> Any:
    """Poll ``condition`` until it returns something true; return that, or raise ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(POLL)


@dataclass
class Node:
    """One Patroni node: its PostgreSQL port, its REST API port, its files and its Patroni process."""

    name: str
    pg_port: int
    api_port: int
    root: Path
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (from ``postmaster.pid``, checked against ``/proc``), or ``None``."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
            # A stale file's pid may belong to another process by now: only ours runs on our data directory.
            if str(self.data).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        return None


class PatroniCluster:
    """etcd and two Patroni-managed PostgreSQL 15 nodes in a temporary directory; a context manager.

    ``__enter__`` returns once a leader runs and the other node is its synchronous standby
    (``pg_stat_replication.sync_state = 'sync'``); ``__exit__`` stops everything and removes the directory, also
    after a failed test.

    Args:
        ttl, loop_wait, retry_timeout: Patroni's timings, in seconds: the leader key lives ``ttl``; a failover
            after a crash takes about ``ttl`` + ``loop_wait``. Patroni requires ``loop_wait + 2 * retry_timeout
            <= ttl``.
        strict: ``synchronous_mode_strict``: with no synchronous standby the leader refuses to acknowledge
            commits (instead of going asynchronous).
    """

    def __init__(
        self, *, ttl: int = 10, loop_wait: int = 1, retry_timeout: int = 3, strict: bool = False
    ) -> None:
        self.root = owned_tempdir("lockkit-patroni-")
        self.ttl, self.loop_wait, self.retry_timeout, self.strict = ttl, loop_wait, retry_timeout, strict
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.nodes = [self._node(f"node{i}") for i in (1, 2)]
        self._etcd: subprocess.Popen[bytes] | None = None
        self._etcd_log: IO[bytes] | None = None

    def _node(self, name: str) -> Node:
        root = self.root / name
        root.mkdir()
        chown(root)
        return Node(name, free_port(), free_port(), root)

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> PatroniCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start etcd, the first node (it bootstraps and leads), then the second (a replica it clones)."""
        self._start_etcd()
        first, second = self.nodes
        self.start_node(first)
        self.wait_for_leader(first.name)
        self.start_node(second)
        self.wait_for_sync_standby()

    def _start_etcd(self) -> None:
        data = self.root / "etcd"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        args = [
            ETCD,
            "--name=lockkit",
            f"--data-dir={data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=lockkit={peer}",
            "--initial-cluster-state=new",
            # One member on loopback: a short election timeout makes its start (and lease expiry checks) quick.
            "--heartbeat-interval=50",
            "--election-timeout=500",
        ]
        self._etcd_log = open(self.root / "etcd.log", "ab")  # noqa: SIM115 - closed in stop()
        self._etcd = subprocess.Popen(
            args, stdout=self._etcd_log, stderr=subprocess.STDOUT, start_new_session=True, **_user_kwargs()
        )

        def healthy() -> bool:
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(f"{client}/health", timeout=2) as reply,
            ):
                return bool(json.load(reply).get("health") == "true")
            return False

        _until(healthy, f"etcd on port {self.etcd_port} (log: {self.root / 'etcd.log'})", START_TIMEOUT)

    def _config(self, node: Node) -> dict[str, Any]:
        hba = [
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            "host replication all 127.0.0.1/32 trust",
        ]
        parameters = {
            "unix_socket_directories": str(node.root),
            # Processes are killed, never the machine: the page cache survives, so fsync buys nothing here.
            "fsync": "off",
            "synchronous_commit": "on",
            "shared_buffers": "16MB",
            "max_connections": "40",
            "deadlock_timeout": "100ms",
            "wal_keep_size": "64MB",
        }
        return {
            "scope": "lockkit",
            "namespace": "/lockkit/",
            "name": node.name,
            "restapi": {
                "listen": f"127.0.0.1:{node.api_port}",
                "connect_address": f"127.0.0.1:{node.api_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": self.ttl,
                    "loop_wait": self.loop_wait,
                    "retry_timeout": self.retry_timeout,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": True,
                    "synchronous_mode_strict": self.strict,
                    "postgresql": {"use_pg_rewind": True, "use_slots": True, "parameters": parameters},
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": hba,
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data),
                "bin_dir": str(PG_BIN),
                "pgpass": str(node.root / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(node.root)},
                "pg_hba": hba,
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    def start_node(self, node: Node) -> None:
        """Start ``node``'s Patroni (which starts, clones or recovers its PostgreSQL)."""
        config = node.root / "patroni.yml"
        config.write_text(json.dumps(self._config(node), indent=2))  # JSON is YAML
        chown(config)
        node.log = open(node.root / "patroni.log", "ab")  # noqa: SIM115 - closed in stop()
        node.process = subprocess.Popen(
            [PATRONI, str(config)],
            stdout=node.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=node.root,
            **_user_kwargs(),
        )

    def stop(self) -> None:
        """Stop both nodes (their PostgreSQL with them) and etcd; remove the directory. Safe to call twice."""
        for node in self.nodes:
            self._stop_node(node)
        if self._etcd is not None:
            _terminate(self._etcd)
            self._etcd = None
        if self._etcd_log is not None:
            self._etcd_log.close()
            self._etcd_log = None
        shutil.rmtree(self.root, ignore_errors=True)

    def _stop_node(self, node: Node) -> None:
        if node.process is not None:
            _terminate(node.process, wait=30)  # Patroni stops its PostgreSQL on SIGTERM
            node.process = None
        _kill_postgres(node)  # a PostgreSQL Patroni did not stop (it was killed, or did not finish in time)
        if node.log is not None:
            node.log.close()
            node.log = None

    # -- the cluster's view ------------------------------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """``GET /cluster`` of the first node whose REST API answers (an empty list when none does)."""
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(f"{node.api}/cluster", timeout=2) as reply,
            ):
                return list(json.load(reply).get("members", []))
        return []

    def node(self, name: str) -> Node:
        """The node called ``name``."""
        return next(node for node in self.nodes if node.name == name)

    def leader(self) -> Node | None:
        """The node Patroni says leads and runs, or ``None`` right now."""
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                return self.node(member["name"])
        return None

    def wait_for_leader(self, name: str | None = None, timeout: float = START_TIMEOUT) -> Node:
        """Wait until a leader (``name``, when given) runs and accepts writes; return it.

        Raises:
            TimeoutError: no such leader within ``timeout`` seconds.
        """

        def ready() -> Node | None:
            node = self.leader()
            if node is None or (name is not None and node.name != name):
                return None
            return node if self._sql(node, "SELECT NOT pg_is_in_recovery()") else None

        return _until(ready, f"leader {name or '(any)'} (log: {self.root})", timeout)  # type: ignore[no-any-return]

    def wait_for_sync_standby(self, timeout: float = START_TIMEOUT) -> Node:
        """Wait until the other node streams from the leader as its synchronous standby; return the standby.

        Observed on both sides: Patroni's ``sync_standby`` role, and ``pg_stat_replication.sync_state = 'sync'``
        on the leader (commits wait for it).

        Raises:
            TimeoutError: no synchronous standby within ``timeout`` seconds.
        """

        def ready() -> Node | None:
            leader = self.leader()
            standby = next((m for m in self.members() if m.get("role") == "sync_standby"), None)
            if leader is None or standby is None:
                return None
            sql = (
                "SELECT count(*) FROM pg_stat_replication WHERE application_name = %s AND sync_state = 'sync'"
            )
            return self.node(standby["name"]) if self._sql(leader, sql, [standby["name"]]) == 1 else None

        return _until(ready, f"a synchronous standby (log: {self.root})", timeout)  # type: ignore[no-any-return]

    def sql(self, node: Node, sql: str, params: Any = None) -> Any:
        """The first column of the first row of ``sql`` on ``node`` (a connection of its own), or ``None`` when
        it returns no row or the node does not answer."""
        return self._sql(node, sql, params)

    def freeze_replication(self, node: Node) -> list[int]:
        """SIGSTOP ``node``'s walsenders: from now on its synchronous commits wait for the standby's
        acknowledgement (``wait_event = 'SyncRep'``), committed locally and not replicated. Return their pids.

        Raises:
            RuntimeError: ``node`` streams to no standby.
        """
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=node.pg_port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            pids = [int(row[0]) for row in conn.execute("SELECT pid FROM pg_stat_replication").fetchall()]
        if not pids:
            raise RuntimeError(f"{node.name} streams to no standby")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def _sql(self, node: Node, sql: str, params: Any = None) -> Any:
        import psycopg  # the harness's users need the driver anyway

        try:
            with psycopg.connect(
                host="127.0.0.1",
                port=node.pg_port,
                user="postgres",
                dbname="postgres",
                connect_timeout=2,
                autocommit=True,
            ) as conn:
                row = conn.execute(sql, params).fetchone()
        except psycopg.Error:
            return None
        return None if row is None else row[0]

    # -- faults ------------------------------------------------------------------------------------------------

    def switchover(self, timeout: float = START_TIMEOUT) -> Node:
        """A planned switchover (``POST /switchover``) from the leader to the other node; return the new leader
        once it accepts writes and the old one is its synchronous standby again.

        Raises:
            RuntimeError: Patroni refused the switchover.
            TimeoutError: the new topology did not settle within ``timeout`` seconds.
        """
        leader = self.wait_for_leader(timeout=timeout)
        candidate = next(node for node in self.nodes if node is not leader)
        body = json.dumps({"leader": leader.name, "candidate": candidate.name}).encode()
        request = urllib.request.Request(
            f"{leader.api}/switchover", data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                reply.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"Patroni refused the switchover: {exc.code} {exc.read()!r}") from exc
        new = self.wait_for_leader(candidate.name, timeout)
        self.wait_for_sync_standby(timeout)
        return new

    def crash_leader(self, timeout: float = START_TIMEOUT) -> tuple[Node, Node]:
        """The leader's machine dies: SIGKILL to its Patroni and to its PostgreSQL (the postmaster's process
        group: the postmaster and every backend at once, no shutdown). Return ``(crashed, new leader)`` once the
        synchronous standby has taken over (after the leader key's ``ttl``). The crashed node stays down.

        Raises:
            TimeoutError: no new leader within ``timeout`` seconds.
        """
        leader = self.wait_for_leader(timeout=timeout)
        survivor = next(node for node in self.nodes if node is not leader)
        assert leader.process is not None
        os.killpg(leader.process.pid, signal.SIGKILL)
        leader.process.wait(10)
        leader.process = None
        _kill_postgres(leader)
        return leader, self.wait_for_leader(survivor.name, timeout)


def _kill_postgres(node: Node) -> None:
    """SIGKILL ``node``'s postmaster and its backends at once, and wait until the postmaster is gone.

    Patroni starts the postmaster in a session of its own (``setsid`` in an intermediate process): its process
    group is not its pid, so the group is looked up.
    """
    pid = node.postmaster_pid()
    if pid is None:
        return
    try:
        group = os.getpgid(pid)
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        return
    _until(lambda: not _alive(pid), f"postmaster {pid} to die", 10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (its parent, Patroni's helper, is gone too: reaped by init soon) counts as dead.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    return False


def _terminate(process: subprocess.Popen[bytes], wait: float = 10) -> None:
    """SIGTERM ``process``'s group, then SIGKILL it after ``wait`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(wait)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
