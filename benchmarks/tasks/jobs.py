"""The trivial task both workers run: one per backend (a Django task is bound to its backend)."""

from __future__ import annotations

from django.tasks import task

from benchmarks.tasks.settings import DJANGO_TASKS_DB, PROCRASTINATE


@task()
def trivial_lockkit() -> None:
    return None


if DJANGO_TASKS_DB:

    @task(backend="django_tasks_db")
    def trivial_django_tasks_db() -> None:
        return None


if PROCRASTINATE:
    from procrastinate.contrib.django import app as procrastinate_app

    @procrastinate_app.task(name="trivial_procrastinate")  # type: ignore[untyped-decorator, unused-ignore]
    def trivial_procrastinate() -> None:
        return None
