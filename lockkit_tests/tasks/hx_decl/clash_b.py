from django.tasks import task

from lockkit.tasks import periodic_task


@periodic_task("0 4 * * *", name="hx-clash")
@task()
def clash_b() -> None:
    return None
