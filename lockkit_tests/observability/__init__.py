"""Observability: signals, OpenTelemetry and Prometheus exporters, awaitable forms, lock inspection."""
