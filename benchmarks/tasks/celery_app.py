"""The Celery side of the task-queue benchmark: the same trivial task on a Redis broker (``--celery-broker``).

Workers run as lockkit's and django-tasks' do: one process each, one task at a time (``-P solo``), with
``acks_late`` and a prefetch of 1. No result backend: the benchmark reads the broker's queue and its unacknowledged
messages to know when every task is done, so the task itself does nothing more than the others' (return ``None``).
"""

from __future__ import annotations

import os

from celery import Celery

#: The queue the benchmark's tasks go to (its workers consume only this one).
QUEUE = "lockkit_bench"

app = Celery(
    "lockkit_bench", broker=os.environ.get("LOCKKIT_BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/15")
)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="lockkit_bench.trivial")  # type: ignore[untyped-decorator]  # celery has no type hints
def trivial() -> None:
    return None
