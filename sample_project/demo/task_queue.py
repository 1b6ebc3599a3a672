"""The job queue on Django 6's Tasks API: J jobs submitted as ``lockkit.tasks`` tasks, W ``lockkit_worker`` processes.

Django 6 only (``django.tasks``). One job is the victim: its task's first attempt marks the job ``running`` and
hangs, and the demo SIGKILLs the worker process running it. Its lease runs out, another worker's claim takes it
(attempt 2, counted when claimed) and finishes it through the app's own task (``sample_project.jobs.tasks``), whose
effect and completion commit together in ``lockkit.tasks.fenced()``. The audit reads the database: every task
``SUCCESSFUL``, every job ``done`` with exactly one ``JobRun`` (its effect), and the victim's two attempts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db.models import Count
from django.tasks import TaskResultStatus, task

from lockkit.tasks import current_claim
from lockkit.tasks.models import QueuedTask
from sample_project.demo.bootstrap import DATABASE_URL_ENV, SETTINGS_MODULE
from sample_project.jobs.models import Job, JobRun
from sample_project.jobs.tasks import run_job, submit

ROOT = Path(__file__).resolve().parents[2]
#: The longest the victim's first attempt hangs (it is killed long before).
HANG = 120.0


@task()
def run_job_after_a_crash(job_id: int) -> dict[str, Any]:
    """The victim: its first attempt marks the job running and hangs until killed; a later one runs the job."""
    if current_claim().attempt == 1:
        Job.objects.filter(pk=job_id).update(state=Job.State.RUNNING)
        threading.Event().wait(HANG)  # "working" when the demo SIGKILLs this worker process
        raise RuntimeError(f"the demo did not kill the worker running job {job_id}")
    result: dict[str, Any] = run_job.call(job_id)
    return result


@dataclass(frozen=True)
class TaskQueueResult:
    """What the database says after the run."""

    jobs: int
    workers: int
    lease: float
    seconds: float
    succeeded: int
    done: int
    attempts: int
    run_twice: int
    lost: int
    killed: str  # the worker id SIGKILLed mid-task ("" if none)
    victim_workers: tuple[str, ...]  # the victim task's attempts, by worker
    exit_codes: tuple[int, ...]  # of the surviving workers, after SIGTERM (0: a clean stop)


def reset(count: int) -> tuple[int, str]:
    """Empty the tables, submit the victim and ``count - 1`` jobs through the app; the victim's job and task ids."""
    QueuedTask.objects.all().delete()
    Job.objects.all().delete()
    victim = Job.objects.create(name="send-receipt", payload={"order": 0})
    result = run_job_after_a_crash.enqueue(victim.pk)
    for order in range(1, count):
        submit("send-receipt", {"order": order})
    return int(victim.pk), str(result.id)


def _worker(url: str, name: str, lease: float, log: Any) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        DATABASE_URL_ENV: url,
        "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = ["lockkit_worker", "--worker-id", name, "--lease", f"{lease:g}", "--verbosity", "0"]
    return subprocess.Popen(
        [sys.executable, "-m", "django", *command], env=env, cwd=ROOT, stdout=log, stderr=log
    )


def run_task_queue(
    url: str,
    jobs: int,
    *,
    workers: int,
    progress: Callable[[int], None],
    lease: float = 2.0,
    timeout: float = 600.0,
) -> TaskQueueResult:
    """Submit ``jobs`` jobs, run ``workers`` ``lockkit_worker`` processes, kill the victim's, audit the database.

    Raises:
        RuntimeError: a worker exited on its own, or the tasks were not all finished within ``timeout`` seconds
            (the workers' output is in the message).
    """
    if jobs < 2 or workers < 2:
        raise ValueError(f"the task queue needs at least 2 jobs and 2 workers, got {jobs} and {workers}")
    victim, victim_task = reset(jobs)
    names = [f"demo-worker-{n}" for n in range(workers)]
    with tempfile.TemporaryFile() as log:
        started = time.monotonic()
        processes = dict(zip(names, (_worker(url, name, lease, log) for name in names), strict=True))
        killed = ""
        finished = QueuedTask.objects.filter(
            status__in=[TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED]
        )
        try:
            deadline = started + timeout
            while (done := finished.count()) < jobs:
                progress(done)
                if not killed and Job.objects.filter(pk=victim, state=Job.State.RUNNING).exists():
                    # The victim's first attempt is running: kill the worker that claimed it.
                    killed = QueuedTask.objects.get(pk=victim_task).worker_ids[-1]
                    processes[killed].send_signal(signal.SIGKILL)
                    processes[killed].wait(30)
                for name, process in processes.items():
                    if name != killed and process.poll() is not None:
                        raise RuntimeError(f"{name} exited with status {process.returncode}: {_output(log)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{done} of {jobs} tasks finished after {timeout:g}s: {_output(log)}")
                time.sleep(0.05)
            seconds = time.monotonic() - started
            progress(jobs)
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.send_signal(
                        signal.SIGTERM
                    )  # finish the running task, give back the others, exit 0
            for process in processes.values():
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
    codes = tuple(process.returncode for name, process in processes.items() if name != killed)
    return _audit(jobs, workers, lease, seconds, killed, victim_task, codes)


def _output(log: Any) -> str:
    log.seek(0)
    return str(log.read().decode(errors="replace")[-4000:])


def _audit(
    jobs: int, workers: int, lease: float, seconds: float, killed: str, victim: str, codes: tuple[int, ...]
) -> TaskQueueResult:
    tasks = list(QueuedTask.objects.all())
    runs = dict(JobRun.objects.values("job_id").annotate(n=Count("id")).values_list("job_id", "n"))
    states = dict(Job.objects.values_list("id", "state"))
    victim_task = next((t for t in tasks if str(t.pk) == victim), None)
    return TaskQueueResult(
        jobs=jobs,
        workers=workers,
        lease=lease,
        seconds=seconds,
        succeeded=sum(t.status == TaskResultStatus.SUCCESSFUL for t in tasks),
        done=sum(state == Job.State.DONE for state in states.values()),
        attempts=sum(len(t.worker_ids) for t in tasks),
        run_twice=sum(n > 1 for n in runs.values()),
        lost=sum(state != Job.State.DONE or pk not in runs for pk, state in states.items()),
        killed=killed,
        victim_workers=tuple(victim_task.worker_ids) if victim_task is not None else (),
        exit_codes=codes,
    )


def broken(result: TaskQueueResult) -> list[str]:
    """What must not happen: a job run twice or lost, a failed task, no kill, no second attempt, a bad exit."""
    problems: list[str] = []
    if result.run_twice:
        problems.append(f"task queue: effects applied twice: {result.run_twice}")
    if result.lost:
        problems.append(f"task queue: {result.lost} jobs lost")
    if result.succeeded != result.jobs:
        problems.append(f"task queue: {result.succeeded} of {result.jobs} tasks SUCCESSFUL")
    if not result.killed:
        problems.append("task queue: no worker was killed mid-task")
    elif len(result.victim_workers) != 2 or result.victim_workers[0] != result.killed:
        problems.append(
            f"task queue: the victim's attempts were {result.victim_workers}, not killed + one more"
        )
    if any(code != 0 for code in result.exit_codes):
        problems.append(f"task queue: workers exited with {result.exit_codes} after SIGTERM (expected 0)")
    return problems
