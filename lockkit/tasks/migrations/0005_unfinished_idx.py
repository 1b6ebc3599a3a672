# The partial indexes of unfinished and of finished tasks, on predicates a prepared claim can prove without its
# parameters' values; and the database's refusal of an unfinished task that carries a finish time.

from typing import Any

from django.db import migrations, models

# Unfinished tasks in the order workers claim them. Its predicate names no value: the worker's claim is a prepared
# statement whose status values are parameters, so a generic plan could never use an index on "status IN ('READY',
# 'RUNNING')" and read and sorted the whole table instead (10 ms a claim at 20,000 tasks); the claim says
# "finished_at IS NULL" in its text. Only where the database has partial indexes (PostgreSQL, SQLite), as before.
UNFINISHED_INDEX = models.Index(
    models.F("priority").desc(),
    "enqueued_at",
    condition=models.Q(finished_at__isnull=True),
    name="lockkit_tasks_unfinished_idx",
)
# Unfinished tasks with a time they become due (run_after, a retry's backoff), by that time: an idle worker reads
# the next one to wake at its time. Tasks due at once (ready_at NULL, most of them) have no entry.
SCHEDULED_INDEX = models.Index(
    fields=["ready_at"],
    condition=models.Q(finished_at__isnull=True, ready_at__isnull=False),
    name="lockkit_tasks_scheduled_idx",
)
TODO_INDEX = models.Index(
    models.F("priority").desc(),
    "enqueued_at",
    condition=models.Q(status__in=("READY", "RUNNING")),
    name="lockkit_tasks_todo_idx",
)
# lockkit_prune_tasks reads the oldest finished tasks by finished_at. Where partial indexes exist, only finished
# tasks are in it: a claim's generic plan, whose statistics may call unfinished tasks rare, cannot take it for
# "finished_at IS NULL" and sort what it finds, and a claim writes no entry to it. MariaDB/MySQL keep the
# whole-column index of 0004. Not in the model's Meta (MariaDB/MySQL would warn about the condition at every command).
FINISHED_INDEX = models.Index(fields=["finished_at"], name="lockkit_tasks_finished_idx")
FINISHED_PARTIAL_INDEX = models.Index(
    fields=["finished_at"], condition=models.Q(finished_at__isnull=False), name="lockkit_tasks_finished_idx"
)


def clear_finish_times(apps: Any, schema_editor: Any) -> None:
    # An unfinished row with a finish time (set back to READY by hand): the workers before 0005 claimed it by its
    # status, so it keeps running; without the finish time that the constraint below refuses.
    model = apps.get_model("lockkit_tasks", "QueuedTask")
    rows = model._default_manager.using(schema_editor.connection.alias)
    rows.filter(status__in=("READY", "RUNNING"), finished_at__isnull=False).update(finished_at=None)


def _present(schema_editor: Any, model: Any, name: str) -> bool:
    # SQLite rebuilds a table for some changes (0002's unique retry_of), keeping only the indexes the model state
    # declares: the index of unfinished tasks 0001 made is gone there.
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        return name in connection.introspection.get_constraints(cursor, model._meta.db_table)


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.features.supports_partial_indexes:
        model = apps.get_model("lockkit_tasks", "QueuedTask")
        schema_editor.add_index(model, UNFINISHED_INDEX)
        schema_editor.add_index(model, SCHEDULED_INDEX)
        if _present(schema_editor, model, TODO_INDEX.name):
            schema_editor.remove_index(model, TODO_INDEX)
        schema_editor.remove_index(model, FINISHED_INDEX)
        schema_editor.add_index(model, FINISHED_PARTIAL_INDEX)


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.features.supports_partial_indexes:
        model = apps.get_model("lockkit_tasks", "QueuedTask")
        schema_editor.remove_index(model, FINISHED_PARTIAL_INDEX)
        schema_editor.add_index(model, FINISHED_INDEX)
        schema_editor.add_index(model, TODO_INDEX)
        schema_editor.remove_index(model, SCHEDULED_INDEX)
        schema_editor.remove_index(model, UNFINISHED_INDEX)


class Migration(migrations.Migration):
    dependencies = [
        ("lockkit_tasks", "0004_queuedtask_finished_idx"),
    ]

    operations = [
        migrations.RunPython(clear_finish_times, migrations.RunPython.noop, elidable=False),
        # Before the indexes: on SQLite a constraint rebuilds the table, keeping only the indexes the model state
        # declares.
        migrations.AddConstraint(
            model_name="queuedtask",
            constraint=models.CheckConstraint(
                condition=models.Q(finished_at__isnull=True) | ~models.Q(status__in=("READY", "RUNNING")),
                name="lockkit_tasks_unfinished_not_finished",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="queuedtask", name="lockkit_tasks_finished_idx"),
            ],
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
        ),
    ]
