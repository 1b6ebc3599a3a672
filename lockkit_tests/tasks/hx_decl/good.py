from django.tasks import task

from lockkit.tasks import periodic_task


@periodic_task("* * * * * *", name="hx-good")
@task()
def good_tick() -> str:
    return "good"
