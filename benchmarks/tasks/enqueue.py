"""``enqueue()`` against a plain ORM insert of the same row, in one transaction each, alternating rounds."""

from __future__ import annotations

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


def measure(rounds: int, count: int, clear: Any) -> list[tuple[float, float]]:
    """``(enqueue, ORM)`` rates per round, the two alternating which goes first; ``clear()`` before each."""
    found: list[tuple[float, float]] = []
    # Warm-up, untimed: the first enqueue builds the backend and its statement, the first create() Django's caches.
    clear()
    enqueue_rate(50)
    orm_rate(50)
    for number in range(rounds):
        rates: dict[str, float] = {}
        for name in ("enqueue", "orm") if number % 2 == 0 else ("orm", "enqueue"):
            clear()
            rates[name] = enqueue_rate(count) if name == "enqueue" else orm_rate(count)
        found.append((rates["enqueue"], rates["orm"]))
    return found
