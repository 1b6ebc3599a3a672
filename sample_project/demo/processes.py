"""Starting demo worker processes, showing their progress, killing the designated victim, collecting."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Callable
from typing import Any

from sample_project.demo.stats import WorkerStats
from sample_project.demo.workers import Channels


class DemoError(RuntimeError):
    """A demo worker crashed, or the workers did not finish in time."""


def run_workers(
    target: Callable[..., None],
    per_worker: list[tuple[Any, ...]],
    *,
    progress: Callable[[int], None],
    timeout: float,
    victim: int | None = None,
) -> tuple[list[WorkerStats], bool]:
    """Run ``target(channels, *args)`` in one spawned process per ``per_worker`` entry; return their stats.

    ``victim`` is the index of a worker that sets ``channels.victim_ready`` mid-job: it is killed with SIGKILL
    then, and sends no stats. Returns the stats received and whether the victim was killed.

    Raises:
        DemoError: a worker exited with an error, or they had not all finished within ``timeout`` seconds.
    """
    ctx = multiprocessing.get_context("spawn")
    channels = Channels(ctx.Value("q", 0), ctx.Queue(), ctx.Barrier(len(per_worker)), ctx.Event())
    processes = [
        ctx.Process(target=target, args=(channels, *args), name=f"demo-worker-{i}", daemon=True)
        for i, args in enumerate(per_worker)
    ]
    for process in processes:
        process.start()
    collected: list[WorkerStats] = []
    killed = False
    deadline = time.monotonic() + timeout
    try:
        # Every worker reports, except a killed victim (one that never reached its victim job reports too).
        while len(collected) < len(processes) - killed:
            with contextlib.suppress(queue.Empty):
                collected.append(channels.results.get(timeout=0.1))
            progress(channels.counter.value)
            if victim is not None and not killed and channels.victim_ready.is_set():
                pid = processes[victim].pid
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                killed = True
            for i, process in enumerate(processes):
                if process.exitcode not in (None, 0) and i != victim:
                    raise DemoError(f"{process.name} exited with status {process.exitcode}")
            if time.monotonic() > deadline:
                raise DemoError(f"the workers had not finished after {timeout:.0f}s")
        progress(channels.counter.value)
        for process in processes:
            process.join(10)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(10)
    return collected, killed
