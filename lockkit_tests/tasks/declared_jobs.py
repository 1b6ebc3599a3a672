"""A task with a schedule declared by ``@periodic_task``: imported only by worker processes that list this module
in ``task_modules`` (imported in the test process, its schedule would join every later worker's there).
"""

from __future__ import annotations

from django.tasks import task

from lockkit.tasks import periodic_task


@periodic_task("*/2 * * * * *", name="declared-tick", kwargs={"source": "decorator"})
@task()
def declared_tick(source: str) -> str:
    return source
