"""What the figures were measured on: hardware, load, software versions and the PostgreSQL server's settings."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import django
import psycopg
from django.db import connection

import lockkit
from benchmarks import pgbench

#: Server settings that decide what a locking benchmark measures.
SERVER_SETTINGS = (
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "wal_sync_method",
    "full_page_writes",
    "commit_delay",
    "max_connections",
    "deadlock_timeout",
    "lock_timeout",
    "default_transaction_isolation",
    "jit",
    "max_wal_size",
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


def load() -> tuple[float, float, float]:
    return os.getloadavg()


def collect(embedded: bool) -> dict[str, Any]:
    """Hardware, versions and server settings, read from this machine and the benchmark's database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        row = cursor.fetchone()
        server_version = str(row[0]) if row else "unknown"
        settings: dict[str, str] = {}
        for name in SERVER_SETTINGS:
            cursor.execute("SELECT current_setting(%s, true)", [name])
            value = cursor.fetchone()
            settings[name] = str(value[0]) if value and value[0] is not None else "n/a"
    return {
        "hardware": {
            "nproc": os.cpu_count(),
            "cpu": _cpu_model(),
            "memory_gib": round(_memory_gib(), 1),
            "kernel": platform.release(),
        },
        "versions": {
            "python": platform.python_version(),
            "django": django.get_version(),
            "psycopg": psycopg.__version__,
            "libpq": psycopg.pq.version(),
            "lockkit": lockkit.__version__,
            "pgbench": pgbench.version(),
            "postgresql": server_version,
        },
        "server": {"embedded": embedded, "settings": settings},
    }
