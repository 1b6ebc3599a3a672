"""Carrying out one scheduled fault against the soak's own cluster, proxy and worker processes."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from typing import Any

import psycopg

from lockkit_harness.cluster import TempCluster
from lockkit_harness.proxy import FaultProxy
from lockkit_harness.soak.plan import Fault

# Worker sessions only: not the soak's own monitoring connection (application_name "soak-monitor").
_SESSIONS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' "
    "AND pid <> pg_backend_pid() AND application_name <> 'soak-monitor'"
)
_ACTIVE = _SESSIONS + " AND state = 'active'"


class Injector:
    """Runs faults; counts what each one actually did (a cancel may find no statement running)."""

    def __init__(
        self,
        cluster: TempCluster | None,
        proxy: FaultProxy,
        kill_worker: Callable[[int], bool],
        workers: int,
        *,
        monitor_url: str,
    ):
        self.cluster = cluster  # None: a server the soak was pointed at, never restarted
        self.monitor_url = monitor_url
        self.proxy = proxy
        self.kill_worker = kill_worker
        self.workers = workers
        self.done: dict[str, int] = {}
        self.missed: dict[str, int] = {}
        self.restart_seconds: list[float] = []
        self._admin: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._admin is None or self._admin.closed or self._admin.broken:
            self._admin = psycopg.connect(
                self.monitor_url, autocommit=True, application_name="soak-monitor", connect_timeout=5
            )
        return self._admin

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a monitoring query on the soak's database (reconnecting after a restart)."""
        for attempt in range(2):
            try:
                return list(self._connection().execute(sql, params).fetchall())
            except psycopg.OperationalError:
                self._admin = None
                if attempt:
                    raise
        return []  # pragma: no cover - the loop returns or raises

    def run(self, fault: Fault) -> bool:
        """Inject ``fault``; return whether it hit something."""
        rng = random.Random(fault.pick)
        hit = False
        with contextlib.suppress(psycopg.Error):
            hit = getattr(self, f"_{fault.kind}")(rng)
        counter = self.done if hit else self.missed
        counter[fault.kind] = counter.get(fault.kind, 0) + 1
        return hit

    def _kill_worker(self, rng: random.Random) -> bool:
        return self.kill_worker(rng.randrange(self.workers))

    def _signal(self, rng: random.Random, sql: str, function: str) -> bool:
        pids = [row[0] for row in self.query(sql)]
        if not pids:
            return False
        rows = self.query(f"SELECT {function}(%s)", [rng.choice(pids)])  # a constant function name of ours
        return bool(rows and rows[0][0])

    def _terminate_session(self, rng: random.Random) -> bool:
        return self._signal(rng, _SESSIONS, "pg_terminate_backend")

    def _cancel_statement(self, rng: random.Random) -> bool:
        return self._signal(rng, _ACTIVE, "pg_cancel_backend")

    def _restart_server(self, rng: random.Random) -> bool:
        if self.cluster is None:
            return False
        self.restart_seconds.append(self.cluster.restart("fast"))
        self._admin = None
        return True

    def _cut(self, action: str) -> bool:
        self.proxy.disarm()
        self.proxy.arm(action)  # type: ignore[arg-type]
        return True

    def _cut_commit_committed(self, rng: random.Random) -> bool:
        return self._cut("deliver")

    def _cut_commit_aborted(self, rng: random.Random) -> bool:
        return self._cut("abort")
