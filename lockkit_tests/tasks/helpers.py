"""Shared by the tasks tests: a backend per vendor, worker processes on the test databases, waiting on rows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.tasks import task_backends
from django.test import override_settings

from lockkit.tasks import DatabaseBackend
from lockkit.tasks.models import QueuedTask
from lockkit.tasks.worker import Stats, Worker
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON

ROOT = Path(__file__).resolve().parents[2]
OPTIONS: dict[str, Any] = {"lease": 5, "max_attempts": 1, "retry_backoff": 0.01, "poll_interval": 0.1}


def tasks_setting(alias: str, **options: Any) -> dict[str, Any]:
    """``TASKS`` with one lockkit backend on ``alias`` (queues ``default`` and ``queue-1``)."""
    return {
        "default": {
            "BACKEND": "lockkit.tasks.DatabaseBackend",
            "QUEUES": ["default", "queue-1"],
            "OPTIONS": {**OPTIONS, "database": alias, **options},
        }
    }


#: The apps whose tables a tasks test empties after itself (not the whole suite's: much faster).
APPS = ["lockkit", "lockkit.tasks", "lockkit_tests"]


def vendor_aliases(*, apps: list[str] | None = None) -> list[Any]:
    """PostgreSQL, MariaDB (when configured) and SQLite, each marked transactional on its alias.

    Args:
        apps: The apps whose tables are emptied after each test (``available_apps``); default ``APPS``: the
            app registry holds only these during the test, and a task path must be in one of them.
    """
    available = apps or APPS

    def mark(*databases: str) -> Any:
        return pytest.mark.django_db(transaction=True, databases=list(databases), available_apps=available)

    mariadb_marks: list[Any] = [mark("default", "mariadb")]
    if not MYSQL_CONFIGURED:
        mariadb_marks = [pytest.mark.skip(reason=MYSQL_SKIP_REASON)]
    return [
        pytest.param("default", id="postgresql", marks=mark("default")),
        pytest.param("mariadb", id="mariadb", marks=mariadb_marks),
        pytest.param("sqlite", id="sqlite", marks=mark("default", "sqlite")),
    ]


@contextmanager
def backend_on(alias: str, **options: Any) -> Iterator[DatabaseBackend]:
    """``TASKS["default"]`` as a lockkit backend on ``alias`` for the block."""
    with override_settings(TASKS=tasks_setting(alias, **options)):
        backend = task_backends["default"]
        assert isinstance(backend, DatabaseBackend)
        yield backend


def run_worker(backend: DatabaseBackend, **kwargs: Any) -> Stats:
    """Run a worker in this process until no task is ready (``burst``), on its own threads."""
    kwargs.setdefault("queues", sorted(backend.queues))
    try:
        return Worker(backend, burst=True, **kwargs).run()
    finally:
        connections.close_all()


def status_of(result: Any) -> str:
    """``result.status`` read anew from the database (``refresh()``), as a plain ``str`` for type checkers."""
    result.refresh()
    return str(result.status)


def rows(alias: str) -> list[QueuedTask]:
    return list(QueuedTask.objects.using(alias).order_by("enqueued_at"))


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``condition`` every 20 ms until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class WorkerProcess:
    """A ``manage.py lockkit_worker`` process on the test databases (``python -m django`` with our settings)."""

    def __init__(
        self, alias: str, *args: str, options: dict[str, Any] | None = None, env: dict[str, str] | None = None
    ) -> None:
        keys = ("NAME", "HOST", "PORT", "USER", "OPTIONS")
        names = {
            a: {k: connections[a].settings_dict.get(k) for k in keys} for a in {"default", "sqlite", alias}
        }
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "lockkit_tests.tasks.worker_settings",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "LOCKKIT_TASKS_TEST_DATABASES": json.dumps(names),
            "LOCKKIT_TASKS_TEST_TASKS": json.dumps(tasks_setting(alias, **(options or {}))),
            **(env or {}),
        }
        self.log_file = tempfile.NamedTemporaryFile(prefix="lockkit-worker-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "lockkit_worker", *args],
            env=env,
            cwd=ROOT,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        """What the worker printed and logged so far."""
        return Path(self.log_file.name).read_text(errors="replace")

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, number: int) -> None:
        self.process.send_signal(number)

    def wait(self, timeout: float = 30.0) -> tuple[int, str]:
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            self.kill()
            raise AssertionError(f"worker {self.pid} did not exit in {timeout}s:\n{self.log()}") from None
        return self.process.returncode, self.log()

    def dump_stacks(self) -> None:
        """Have the worker write every thread's stack to its log (``faulthandler`` on ``SIGUSR1``), if it runs."""
        if self.process.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while "most recent call first" not in self.log() and time.monotonic() < deadline:
            time.sleep(0.02)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


@contextmanager
def worker_process(
    alias: str, *args: str, options: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> Iterator[WorkerProcess]:
    """A worker process for the block; killed (``SIGCONT`` then ``SIGKILL``) if still running at the end.

    Args:
        alias: The database alias of the backend.
        args: The command's arguments.
        options: The backend's ``OPTIONS`` (over the tests' defaults).
        env: Environment variables added (``LOCKKIT_TASKS_TEST_NO_LOGGING=1``: no ``LOGGING`` setting).
    """
    worker = WorkerProcess(alias, *args, options=options, env=env)
    try:
        yield worker
    except AssertionError as failure:
        raise AssertionError(f"{failure}\n--- worker {worker.pid} log ---\n{worker.log()}") from failure
    finally:
        if worker.process.poll() is None:
            worker.signal(signal.SIGCONT)
            worker.kill()
        worker.log_file.close()
        os.unlink(worker.log_file.name)


def marker(tmp_path: Path, name: str) -> str:
    """A path prefix for the files a task writes (``<prefix>.started``...)."""
    return str(tmp_path / name)


def freeze(worker: WorkerProcess, alias: str, tries: int = 50) -> None:
    """``SIGSTOP`` ``worker`` while none of its sessions holds a transaction open (observed on the database).

    Stopped between two statements of a transaction (a heartbeat on MariaDB is several), a worker would keep its
    row locks for as long as it stays stopped, and another worker's ``SKIP LOCKED`` would pass its tasks by.
    """
    for _ in range(tries):
        worker.signal(signal.SIGSTOP)
        if not _open_transactions(alias):
            return
        worker.signal(signal.SIGCONT)
        wait_for(lambda: not _open_transactions(alias), what="the worker's transaction to end")
    raise AssertionError(f"worker {worker.pid} was inside a transaction at each of {tries} SIGSTOPs")


def _open_transactions(alias: str) -> int:
    """Transactions open on ``alias``'s database by other sessions than this one's."""
    connection = connections[alias]
    if connection.vendor == "mysql":
        sql = (
            "SELECT COUNT(*) FROM information_schema.innodb_trx t JOIN information_schema.processlist p "
            "ON p.ID = t.trx_mysql_thread_id WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID()"
        )
    else:
        sql = (
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> "
            "pg_backend_pid() AND state LIKE 'idle in transaction%%'"
        )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        (count,) = cursor.fetchone()
    return int(count)


def lease_expired(alias: str) -> bool:
    """Whether every claimed task's lease has run out, by the database clock (as claiming sees it)."""
    from lockkit.claims.sql import claims_sql_for

    now = claims_sql_for(QueuedTask, alias).now()
    claimed = QueuedTask.objects.using(alias).filter(lease_expires_at__isnull=False)
    return claimed.exists() and not claimed.filter(lease_expires_at__gte=now).exists()
