from django.tasks import task

from lockkit.tasks import periodic_task


@periodic_task("* * * * * *", name="hx-imm")
@task(backend="imm")
def imm_tick() -> str:
    return "imm"
