"""Task metrics: outcomes counted (``lockkit.signals.task_counted``) and the oldest ready task's age, exported."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from lockkit import events
from lockkit.contrib import otel, prometheus
from lockkit.tasks.models import QueuedTask
from lockkit.tasks.tally import oldest_ready_age
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, run_worker, vendor_aliases

pytestmark = pytest.mark.parametrize("alias", vendor_aliases())


def _otel_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_task_outcomes_and_oldest_ready_age_exported(alias: str) -> None:
    registry = CollectorRegistry()
    metrics = prometheus.install(registry, task_backends=["default"])
    reader = InMemoryMetricReader()
    tracked = otel.install_task_metrics(MeterProvider(metric_readers=[reader]), task_backends=["default"])
    try:
        with backend_on(alias, max_attempts=2, retry_backoff=0.01) as backend:
            assert oldest_ready_age("default") is None
            assert (
                registry.get_sample_value("lockkit_tasks_oldest_ready_age_seconds", {"backend": "default"})
                == 0
            )
            jobs.calculate_meaning_of_life.enqueue()
            jobs.failing_task_value_error.enqueue()
            jobs.lose_own_claim.enqueue(alias)
            QueuedTask.objects.using(alias).update(enqueued_at=F("enqueued_at") - timedelta(seconds=600))
            age = registry.get_sample_value("lockkit_tasks_oldest_ready_age_seconds", {"backend": "default"})
            assert age is not None
            assert 600 <= age < 700
            (point,) = _otel_points(reader)["lockkit.tasks.oldest_ready_age"]
            assert 600 <= point.value < 700

            stats = run_worker(backend, concurrency=1, batch=1)
            QueuedTask.objects.using(alias).filter(status="READY").update(
                ready_at=None
            )  # a retry not due yet
            again = run_worker(backend, concurrency=1, batch=1)

        counts = (stats.succeeded, stats.retried, stats.lost, stats.failed + again.failed)
        assert counts == (1, 1, 1, 1)
        for outcome, expected in {"succeeded": 1, "retried": 1, "lost": 1, "failed": 1}.items():
            labels = {"backend": "default", "queue": "default", "outcome": outcome}
            assert registry.get_sample_value("lockkit_tasks_total", labels) == expected, outcome
        points = _otel_points(reader)
        counted = {p.attributes["lockkit.tasks.outcome"]: p.value for p in points["lockkit.tasks"]}
        assert counted == {"succeeded": 1, "retried": 1, "lost": 1, "failed": 1}
        assert [p.value for p in points["lockkit.tasks.oldest_ready_age"]] == [0.0]  # nothing waits now
    finally:
        metrics.uninstall()
        tracked.uninstall()
    assert not events.observing()
