from django.db import migrations, models

import lockkit.tasks.arguments


class Migration(migrations.Migration):
    dependencies = [("lockkit_tasks", "0001_initial")]

    operations = [
        migrations.AddConstraint(
            model_name="queuedtask",
            constraint=models.CheckConstraint(
                condition=models.Q(("priority__range", (-100, 100))), name="lockkit_tasks_priority_range"
            ),
        ),
        migrations.AddField(
            model_name="queuedtask",
            name="retry_of",
            field=models.UUIDField(blank=True, editable=False, null=True, unique=True),
        ),
        migrations.AddField(
            model_name="queuedtask",
            name="return_value_recorded",
            field=models.BooleanField(default=True),
        ),
        migrations.AlterField(
            model_name="queuedtask",
            name="args_kwargs",
            field=models.JSONField(encoder=lockkit.tasks.arguments.FloatKeepingEncoder),
        ),
        migrations.AlterField(
            model_name="queuedtask",
            name="return_value",
            field=models.JSONField(
                blank=True, encoder=lockkit.tasks.arguments.FloatKeepingEncoder, null=True
            ),
        ),
    ]
