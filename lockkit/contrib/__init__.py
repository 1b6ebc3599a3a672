"""Optional integrations, each with its own extra: ``otel``, ``prometheus`` and ``drf`` (Django REST framework)."""
