"""Optional integrations, each installed by an explicit call: ``otel`` (OpenTelemetry) and ``prometheus``."""
