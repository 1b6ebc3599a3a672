from django.tasks import task

from lockkit.tasks import periodic_task


@periodic_task("0 3 * * *", name="hx-clash")
@task()
def clash_a() -> None:
    return None
