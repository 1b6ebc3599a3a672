"""Idle wake-up: how long after an enqueue commits an idle worker starts the task.

One worker process, idle (warmed up, then left with nothing to do for a moment before each sample). Each sample is
one task enqueued in its own transaction; the server's clock is read (``clock_timestamp()``) in that transaction just
before its ``COMMIT``, and the wake-up is the task's ``started_at`` minus that reading: the commit's round trip, the
notification (lockkit: ``LISTEN``/``NOTIFY``) or the poll (``db_worker``: its ``--interval``), and the claim. Both
clocks are this machine's (the server's, and for ``db_worker``, whose ``started_at`` is written by the worker, the
worker's).
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

from benchmarks.tasks.run import ROOT, _clear, _command, _environment, _model, _wait_for

#: Seconds each sample leaves the worker idle before its enqueue (its wait for work begins again).
IDLE = 0.2


def _one(worker: str) -> float:
    """Enqueue one task, committed; return its wake-up in milliseconds."""
    from django.db import connection, transaction

    from benchmarks.tasks import jobs

    chosen: Any = jobs.trivial_lockkit if worker == "lockkit" else jobs.trivial_django_tasks_db
    with transaction.atomic():
        result = chosen.enqueue()
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            row = cursor.fetchone()
            assert row is not None
            committing: datetime = row[0]
    deadline = time.monotonic() + 30
    while True:
        started = _model(worker).objects.filter(pk=result.id).values_list("started_at", flat=True).first()
        if started is not None:
            return float((started - committing).total_seconds()) * 1000
        if time.monotonic() > deadline:
            raise RuntimeError(f"{worker}: a task enqueued while idle did not start within 30s")
        time.sleep(0.001)


def measure(url: str, worker: str, samples: int) -> list[float]:
    """Milliseconds from commit to start for ``samples`` tasks, each enqueued while one worker is idle."""
    _clear(worker)
    process = subprocess.Popen(
        [sys.executable, "-m", "django", *_command(worker, 1)],
        env=_environment(url),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from benchmarks.tasks.run import _enqueue

        _enqueue(worker, 5)
        _wait_for(worker, 5, timeout=120)  # up, listening and warmed up
        found = []
        for _ in range(samples):
            time.sleep(IDLE)  # the idle spell being measured, not a synchronisation
            found.append(_one(worker))
        return found
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def table(measured: dict[str, list[list[float]]]) -> str:
    """p50 and p90 per worker: the median over rounds of each round's figure, with the min-max."""
    lines = [
        "| idle wake-up (commit to start) | samples | p50 ms: median (min\u2013max) | p90 ms: median (min\u2013max) |",
        "|---|---:|---:|---:|",
    ]
    labels = {"lockkit": "lockkit_worker (LISTEN/NOTIFY)", "django_tasks_db": "django-tasks db_worker (poll)"}
    for worker, rounds in measured.items():
        p50 = [statistics.median(r) for r in rounds]
        p90 = [statistics.quantiles(r, n=10)[-1] for r in rounds]
        count = sum(len(r) for r in rounds)
        lines.append(
            f"| {labels[worker]} | {count} | {statistics.median(p50):.1f} ({min(p50):.1f}\u2013{max(p50):.1f}) "
            f"| {statistics.median(p90):.1f} ({min(p90):.1f}\u2013{max(p90):.1f}) |"
        )
    return "\n".join(lines)
