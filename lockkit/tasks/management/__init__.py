"""Management commands of lockkit.tasks."""
