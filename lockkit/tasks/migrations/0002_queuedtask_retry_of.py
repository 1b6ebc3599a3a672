from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("lockkit_tasks", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="queuedtask",
            name="retry_of",
            field=models.UUIDField(blank=True, editable=False, null=True, unique=True),
        ),
    ]
