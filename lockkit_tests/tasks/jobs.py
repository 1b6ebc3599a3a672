"""Task functions the tasks tests enqueue (imported by worker processes too, by their dotted paths)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import connections, transaction
from django.dispatch import receiver
from django.tasks import TaskContext, task
from django.tasks.signals import task_finished, task_started

from lockkit.tasks import current_claim, fenced
from lockkit_tests.models import Owner


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task()
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


class ComplexError(Exception):
    def __init__(self, value: object) -> None:
        super().__init__("complex")
        self.value = value


@task()
def complex_exception() -> None:
    raise ComplexError(object())


@task()
def complex_return_value() -> Any:
    return object()  # not JSON: the attempt fails


@task()
def exit_task() -> None:
    sys.exit(1)


@task(takes_context=True)
def context_task(context: TaskContext[..., Any], marker: str) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id, "marker": marker}


@task(takes_context=True)
def fail_until(context: TaskContext[..., Any], succeed_on: int) -> int:
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    return context.attempt


@task()
def kill_own_worker() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # a poison task: takes its worker down every time


@task()
def slow(marker: str, seconds: float) -> str:
    """Write ``<marker>.started``, sleep, write ``<marker>.done``: the tests watch the files, not the clock."""
    Path(marker + ".started").write_text(str(os.getpid()))
    time.sleep(seconds)
    Path(marker + ".done").write_text(str(os.getpid()))
    return "slept"


@task()
def asyncio_with_signal_handler() -> str:
    """Run an asyncio program that adds a signal handler of its own: its loop takes the signal wakeup fd, and leaves
    none when it closes."""

    async def main() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, lambda: None)
        await asyncio.sleep(0.01)

    asyncio.run(main())
    return "ran"


@task()
def sleep_in_the_database(marker: str, seconds: float, alias: str) -> str:
    """Write ``<marker>.started``, then wait ``seconds`` inside one query (MariaDB's ``SLEEP``: a driver call that
    does not return to Python when a signal arrives)."""
    Path(marker + ".started").write_text(str(os.getpid()))
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT SLEEP(%s)", [seconds])
    return "slept"


@task()
def slow_then_fenced_write(marker: str, seconds: float, alias: str) -> str:
    """Start, sleep (the first claim only), then write a database effect in ``lockkit.tasks.fenced()``.

    The effect is written exactly once per task. The sleep keeps the first worker out of ``fenced()`` while the
    test freezes it: frozen inside the block, it would hold the row lock and no other worker could take the task.
    """
    claim = current_claim()
    Path(f"{marker}.{claim.token}.started").write_text(str(os.getpid()))
    time.sleep(seconds if claim.attempt == 1 else 0)
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=f"effect-{claim.pk}"[:40])
    return f"written by token {claim.token}"


@task()
def fenced_write_then_sleep(marker: str, seconds: float, alias: str) -> str:
    """Write an effect in ``fenced()``, then sleep inside the block (the first claim only): idle in its transaction."""
    claim = current_claim()
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=f"idle-{claim.pk}"[:40])
        Path(f"{marker}.{claim.token}.written").write_text(str(os.getpid()))
        time.sleep(seconds if claim.attempt == 1 else 0)
        Path(f"{marker}.{claim.token}.done").write_text(str(os.getpid()))
    return f"written by token {claim.token}"


@task(takes_context=True)
def hang_on_first_attempt(context: TaskContext[..., Any], marker: str) -> int:
    """Attempt 1 writes ``<marker>.started`` and hangs (to be killed); later attempts return theirs."""
    if context.attempt == 1:
        Path(marker + ".started").write_text(str(os.getpid()))
        time.sleep(120)
    return context.attempt


@task()
def fenced_effect(name: str) -> str:
    """Write one database effect in ``lockkit.tasks.fenced()``, a little slowly (a restart meets it mid-way)."""
    time.sleep(0.05)
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=name)
    return name


@task()
def fenced_effect_then_raise(name: str) -> str:
    """Write one database effect in ``lockkit.tasks.fenced()``, then raise inside the block (rolled back)."""
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=name)
        raise ValueError(f"{name}: raised inside the fenced() block")


@task()
def immediate_then_fenced(name: str) -> str:
    """Run ``fenced_effect`` on the ``"immediate"`` backend (Django's ``ImmediateBackend``: at once, in this thread),
    then write this task's own effect in ``fenced()``."""
    inner = fenced_effect.using(backend="immediate").enqueue(f"{name}-inner")
    if inner.status != "SUCCESSFUL":
        raise RuntimeError(f"the immediate task failed: {[e.traceback for e in inner.errors]}")
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=name)
    return name


@task()
def nested_fenced(name: str) -> str:
    """Write an effect in ``fenced()``, and another in a ``fenced()`` block nested in the first (a misuse)."""
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=name)
        with fenced() as inner:
            Owner.objects.using(inner.alias).create(name=f"{name}-inner")
    return name


@task()
def fenced_twice(name: str) -> str:
    """Write an effect in ``fenced()``, then another in a second ``fenced()`` block (a misuse: once per task)."""
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=name)
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=f"{name}-again")
    return name


@task()
def fenced_in_atomic_then_raise(name: str, alias: str) -> str:
    """Write an effect in ``fenced()`` inside the task's own ``atomic()``, then raise in that ``atomic()``: the
    block's writes and its completion roll back with it."""
    with transaction.atomic(using=alias):
        with fenced() as scope:
            Owner.objects.using(scope.alias).create(name=name)
        raise ValueError(f"{name}: raised after the fenced() block, inside the task's atomic()")


@task()
def fenced_then_base_exception(name: str, kind: str) -> str:
    """Write an effect in ``fenced()``, then raise a ``BaseException`` that is not an ``Exception`` inside the block."""
    raised: dict[str, type[BaseException]] = {
        "KeyboardInterrupt": KeyboardInterrupt,
        "SystemExit": SystemExit,
        "GeneratorExit": GeneratorExit,
    }
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=name)
        raise raised[kind](f"{name}: raised inside the fenced() block")


@task()
def return_lone_surrogate() -> str:
    return "lone \ud800"  # no database's JSON column stores it: the attempt fails, the worker carries on


@task()
def return_text(size: int) -> str:
    return "x" * size


#: Exception messages that no database's JSON column stores as they are (a NUL, a lone surrogate, megabytes).
UNSTORABLE_MESSAGES = {"nul": "a \x00 NUL", "surrogate": "a \ud800 surrogate", "huge": "x" * 5_000_000}


@task()
def raise_unstorable_message(kind: str) -> None:
    raise RuntimeError(UNSTORABLE_MESSAGES[kind])


@task()
def interrupt_task() -> None:
    raise KeyboardInterrupt  # the task's own: an ordinary failure, never its worker's end


@task()
def bomb_on_started() -> str:
    return "never reached: a task_started receiver raises first"


@task()
def arm_alarm_and_ignore_sigterm() -> str:
    """Arm a 0.3 s timer whose handler raises (a time limit of its own), ignore SIGTERM, and return at once."""

    def too_late(number: int, frame: Any) -> None:
        raise TimeoutError("the task's own time limit, fired after it returned")

    signal.signal(signal.SIGALRM, too_late)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return "armed"


@task()
def arm_alarm_and_fail(seconds: float) -> str:
    """Arm a timer of ``seconds`` whose handler raises, and fail at once (the timer fires while the failure is
    written, when that takes longer)."""

    def too_late(number: int, frame: Any) -> None:
        raise TimeoutError("the task's own time limit, fired after it ended")

    signal.signal(signal.SIGALRM, too_late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    raise ValueError("failed after arming a timer")


@task()
def bomb_on_finished() -> str:
    return "done, then a task_finished receiver asks the process to exit"


@task()
def leave_autocommit_off(alias: str, name: str) -> str:
    """Turn autocommit off on the worker's connection, write, and return without committing."""
    transaction.set_autocommit(False, using=alias)
    Owner.objects.using(alias).create(name=name)
    return "returned with autocommit off"


@task()
def leave_atomic_open(alias: str, name: str) -> str:
    """Enter an atomic() block on the worker's connection, write, and return without leaving it."""
    transaction.atomic(using=alias).__enter__()
    Owner.objects.using(alias).create(name=name)
    return "returned inside atomic()"


@contextmanager
def finished_receiver() -> Iterator[list[Any]]:
    """A ``task_finished`` receiver for the block; yields the results it was sent."""
    seen: list[Any] = []

    def record(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(task_result)

    task_finished.connect(record)
    try:
        yield seen
    finally:
        task_finished.disconnect(record)


@receiver(task_started)
def _raise_on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
    if task_result.task.module_path == bomb_on_started.module_path:
        raise RuntimeError("a task_started receiver failed")


@receiver(task_finished)
def _exit_on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    if task_result.task.module_path == bomb_on_finished.module_path:
        raise SystemExit(0)  # escapes the attempt: its runner cannot go on


@task(takes_context=True)
def lose_own_claim(context: TaskContext[..., Any], alias: str) -> None:
    """Another worker takes this task's claim while it runs: the worker's outcome is dropped (``lost``)."""
    from django.db.models import F

    from lockkit.tasks.models import QueuedTask

    QueuedTask.objects.using(alias).filter(pk=context.task_result.id).update(
        claimed_by="thief", claim_token=F("claim_token") + 1
    )


@task(takes_context=True)
def fenced_after_hang(context: TaskContext[..., Any], marker: str) -> int:
    """Attempt 1 writes ``<marker>.started`` and hangs (to be killed); later attempts write in ``fenced()``."""
    if context.attempt == 1:
        Path(marker + ".started").write_text(str(os.getpid()))
        time.sleep(120)
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=f"fenced-{context.attempt}")
    return context.attempt


@task()
def fenced_then_raise(name: str) -> str:
    """Write in ``fenced()``, then raise: the task stays ``SUCCESSFUL``, without its value."""
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=name)
    raise RuntimeError(f"{name}: raised after the fenced() block committed")


@task()
def fenced_then_die(name: str) -> str:
    """Write in ``fenced()``, then kill the worker before it can record the return value."""
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=name)
    os.kill(os.getpid(), signal.SIGKILL)
    return name


@task()
def fenced_then_lose_connection(name: str) -> str:
    """Write in ``fenced()``, then end the worker's own database session from another one, and return ``name``.

    The worker's next statement, the one recording the return value, finds its connection gone.
    """
    with fenced() as scope:
        Owner.objects.using(scope.alias).create(name=name)
        alias = scope.alias
    connection = connections[alias]
    vendor = connection.vendor
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()" if vendor == "postgresql" else "SELECT CONNECTION_ID()")
        (session,) = cursor.fetchone()
    other = connections.create_connection(alias)
    try:
        with other.cursor() as cursor:
            if vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [session])  # waits until it is gone
            else:
                cursor.execute(f"KILL CONNECTION {int(session)}")
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    cursor.execute(
                        "SELECT COUNT(*) FROM information_schema.processlist WHERE id = %s", [session]
                    )
                    if cursor.fetchone()[0] == 0:
                        break
                    time.sleep(0.02)
    finally:
        other.close()
    return name


#: Floats PostgreSQL's jsonb would turn into integers (or other values) if written as Python writes them.
AWKWARD_FLOATS = [1e16, 1.5e16, -2e22, 1e300, 1.7976931348623157e308, 1e-300, 5e-324, 0.1, 123456789.125]
