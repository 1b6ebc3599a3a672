"""The table of the job queue on lockkit.tasks (Django 6): what the database says after the workers ran."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from sample_project.demo.report import _bad, code_of
from sample_project.demo.task_queue import TaskQueueResult, run_job_after_a_crash
from sample_project.jobs.tasks import run_job, submit


def task_queue_table(result: TaskQueueResult) -> Group:
    """One column: the tasks, the attempts, the killed worker's task taken again after its lease, the audit."""
    table = Table(
        title=(
            f"Job queue on lockkit.tasks: {result.jobs:,} tasks, {result.workers} manage.py lockkit_worker "
            "processes, one SIGKILLed mid-task"
        )
    )
    table.add_column("")
    table.add_column("lockkit.tasks + lockkit_worker", justify="right")
    victim = " then ".join(result.victim_workers) or "-"
    rows = [
        ("tasks SUCCESSFUL", f"{result.succeeded:,} of {result.jobs:,}"),
        ("jobs done", f"{result.done:,} of {result.jobs:,}"),
        ("attempts (claims, counted when claimed)", f"{result.attempts:,}"),
        ("worker SIGKILLed mid-task", result.killed or "[red]none[/red]"),
        (f"its task, taken again after the {result.lease:g}s lease", f"attempt 2 of 2 ({victim})"),
        ("wall time (worker start-up and the lease wait included)", f"{result.seconds:.1f} s"),
        (
            "workers exiting 0 on SIGTERM",
            f"{sum(code == 0 for code in result.exit_codes)} of {len(result.exit_codes)}",
        ),
        ("effects applied twice", _bad(result.run_twice, must_be_zero=True)),
        ("jobs lost", _bad(result.lost, must_be_zero=True)),
    ]
    for name, cell in rows:
        table.add_row(name, cell)
    legend = Text(
        "The code it runs:\n"
        + "\n".join(
            f"  {code_of(function)}" for function in (submit, run_job.func, run_job_after_a_crash.func)
        )
        + "\n  manage.py lockkit_worker (lockkit/tasks/worker.py)"
    )
    return Group(table, legend)
