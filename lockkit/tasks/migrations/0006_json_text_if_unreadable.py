# The task table's JSON fields decode a document Python cannot read (nested too deep, an integer too long) as its
# text (lockkit.tasks.arguments.TextIfUnreadable): no column changes. SQLite rebuilds the table for any AlterField,
# keeping only the indexes the model state declares: the partial indexes 0005 made are made again there (both ways).

from importlib import import_module
from typing import Any

from django.db import migrations, models

import lockkit.tasks.arguments

_0005 = import_module("lockkit.tasks.migrations.0005_unfinished_idx")


def partial_indexes_again(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if not connection.features.supports_partial_indexes:
        return
    model = apps.get_model("lockkit_tasks", "QueuedTask")
    for index in (_0005.UNFINISHED_INDEX, _0005.SCHEDULED_INDEX, _0005.FINISHED_PARTIAL_INDEX):
        if not _0005._present(schema_editor, model, index.name):
            schema_editor.add_index(model, index)


class Migration(migrations.Migration):
    dependencies = [("lockkit_tasks", "0005_unfinished_idx")]

    operations = [
        # Unapplied, the AlterFields below rebuild the table again: the indexes are made again after them.
        migrations.RunPython(migrations.RunPython.noop, partial_indexes_again, elidable=False),
        migrations.AlterField(
            model_name="queuedtask",
            name="args_kwargs",
            field=models.JSONField(
                decoder=lockkit.tasks.arguments.TextIfUnreadable,
                encoder=lockkit.tasks.arguments.FloatKeepingEncoder,
            ),
        ),
        migrations.AlterField(
            model_name="queuedtask",
            name="errors",
            field=models.JSONField(
                blank=True, decoder=lockkit.tasks.arguments.TextIfUnreadable, default=list
            ),
        ),
        migrations.AlterField(
            model_name="queuedtask",
            name="return_value",
            field=models.JSONField(
                blank=True,
                decoder=lockkit.tasks.arguments.TextIfUnreadable,
                encoder=lockkit.tasks.arguments.FloatKeepingEncoder,
                null=True,
            ),
        ),
        migrations.RunPython(partial_indexes_again, migrations.RunPython.noop, elidable=False),
    ]
