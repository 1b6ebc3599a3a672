"""``enqueue()`` against a plain ORM insert of the same row (and procrastinate's ``defer()`` when installed), in one
transaction each, alternating rounds.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def enqueue_rate(count: int) -> float:
    """Enqueues per second: ``count`` ``lockkit.tasks`` enqueues in one ``atomic()``."""
    from django.db import transaction

    from benchmarks.tasks import jobs

    started = time.perf_counter()
    with transaction.atomic():
        for _ in range(count):
            jobs.trivial_lockkit.enqueue()
    return count / (time.perf_counter() - started)


def orm_rate(count: int) -> float:
    """Inserts per second: ``count`` ``QueuedTask.objects.create()`` of the row an enqueue writes, in one ``atomic()``."""
    from django.db import transaction
    from django.utils import timezone

    from lockkit.tasks.models import QueuedTask

    started = time.perf_counter()
    with transaction.atomic():
        for _ in range(count):
            QueuedTask.objects.create(
                backend_name="default",
                queue_name="default",
                priority=0,
                task_path="benchmarks.tasks.jobs.trivial_lockkit",
                takes_context=False,
                args_kwargs={"args": [], "kwargs": {}},
                status="READY",
                enqueued_at=timezone.now(),
            )
    return count / (time.perf_counter() - started)


def procrastinate_rate(count: int) -> float:
    """Defers per second: ``count`` procrastinate ``defer()`` in one ``atomic()`` (its Django connector)."""
    from django.db import transaction

    from benchmarks.tasks import jobs

    started = time.perf_counter()
    with transaction.atomic():
        for _ in range(count):
            jobs.trivial_procrastinate.defer()
    return count / (time.perf_counter() - started)


def _clear_procrastinate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE procrastinate_jobs CASCADE")


def measure(rounds: int, count: int, clear: Any) -> list[dict[str, float]]:
    """Rates per round (``enqueue``, ``orm``, and ``procrastinate`` when installed), the order rotating round by
    round; ``clear()`` (or procrastinate's ``TRUNCATE``) before each.
    """
    from benchmarks.tasks.settings import PROCRASTINATE

    timed = {"enqueue": enqueue_rate, "orm": orm_rate}
    clears = {"enqueue": clear, "orm": clear}
    if PROCRASTINATE:
        timed["procrastinate"] = procrastinate_rate
        clears["procrastinate"] = _clear_procrastinate
    names = list(timed)
    # Warm-up, untimed: the first enqueue builds the backend and its statement, the first create() Django's caches.
    for name in names:
        clears[name]()
        timed[name](50)
    found: list[dict[str, float]] = []
    for number in range(rounds):
        rates: dict[str, float] = {}
        for name in names[number % len(names) :] + names[: number % len(names)]:
            clears[name]()
            rates[name] = timed[name](count)
        found.append(rates)
    return found


def table(inserts: list[dict[str, float]], count: int) -> str:
    """Median (min-max) rows/s of each, and lockkit's ratios within each round."""

    def spread(values: list[float], fmt: str) -> str:
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}\u2013{max(values):{fmt}})"

    rounds = len(inserts)
    lines = [
        f"| one transaction of {count} | rounds | rows/s: median (min\u2013max) |",
        "|---|---:|---:|",
        f"| lockkit enqueue() | {rounds} | {spread([r['enqueue'] for r in inserts], ',.0f')} |",
        f"| QueuedTask.objects.create() | {rounds} | {spread([r['orm'] for r in inserts], ',.0f')} |",
    ]
    if "procrastinate" in inserts[0]:
        lines.append(
            f"| procrastinate defer() | {rounds} | {spread([r['procrastinate'] for r in inserts], ',.0f')} |"
        )
    lines.append(
        f"| enqueue / ORM (within each round) | {rounds} | {spread([r['enqueue'] / r['orm'] for r in inserts], '.2f')} |"
    )
    if "procrastinate" in inserts[0]:
        ratios = [r["enqueue"] / r["procrastinate"] for r in inserts]
        lines.append(f"| enqueue / procrastinate (within each round) | {rounds} | {spread(ratios, '.2f')} |")
    return "\n".join(lines)
