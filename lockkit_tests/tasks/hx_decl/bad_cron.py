from django.tasks import task

from lockkit.tasks import periodic_task


@periodic_task("61 * * * *")
@task()
def bad_cron() -> None:
    return None
