"""Task-queue throughput: ``lockkit_worker`` next to django-tasks' ``db_worker`` (``python -m benchmarks.tasks``)."""
