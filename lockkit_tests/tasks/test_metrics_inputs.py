"""The task metrics' inputs checked at install, and a backend whose gauge cannot be read: NaN, logged, never a
failed scrape of the whole registry (Prometheus) or of every backend (OpenTelemetry).

Before, ``task_backends="default"`` (a string) and ``["typo"]`` were accepted, and then every scrape of the
registry raised; ``oldest_ready_age(None)`` raised ``TypeError: attribute name must be string``.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any

import pytest
from django.test import override_settings
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from lockkit.contrib import otel, prometheus
from lockkit.tasks.tally import oldest_ready_age
from lockkit_tests.tasks.helpers import backend_on, tasks_setting, vendor_aliases

IMMEDIATE = {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}

BAD = [
    pytest.param("default", TypeError, "task_backends must be a list of aliases", id="str"),
    pytest.param(5, TypeError, "task_backends must be a list of aliases", id="int"),
    pytest.param(["default", 5], TypeError, "task_backends must hold aliases .*5", id="int-item"),
    pytest.param(["typo"], ValueError, "task_backends: 'typo' is not an alias of settings.TASKS", id="typo"),
    pytest.param(
        ["immediate"], ValueError, "task_backends: 'immediate' is .*ImmediateBackend, not", id="not-lockkit"
    ),
]


@pytest.mark.parametrize(("given", "error", "message"), BAD)
def test_bad_task_backends_are_refused_at_install_naming_the_parameter(
    given: Any, error: type[Exception], message: str
) -> None:
    """No database access is allowed here: the checks run no SQL. Nothing is left registered."""
    with override_settings(TASKS={**tasks_setting("default"), "immediate": IMMEDIATE}):
        registry = CollectorRegistry()
        with pytest.raises(error, match=message):
            prometheus.install(registry, task_backends=given)
        assert list(registry.collect()) == []
        prometheus.install(registry, task_backends=["default"]).uninstall()  # the registry is usable
        with pytest.raises(error, match=message):
            otel.install_task_metrics(MeterProvider(), task_backends=given)


@pytest.mark.parametrize("given", [None, 5, ["default"]])
def test_oldest_ready_age_refuses_a_backend_that_is_not_a_str(given: Any) -> None:
    with pytest.raises(TypeError, match=r"^backend must be an alias of settings.TASKS \(a str\), not "):
        oldest_ready_age(given)


@pytest.mark.parametrize("alias", vendor_aliases())
def test_a_backend_that_cannot_be_read_is_nan_and_logged_and_the_scrape_goes_on(
    alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    both = {**tasks_setting(alias), "second": tasks_setting(alias)["default"]}
    with override_settings(TASKS=both):
        registry = CollectorRegistry()
        metrics = prometheus.install(registry, task_backends=["default", "second"])
        reader = InMemoryMetricReader()
        tracked = otel.install_task_metrics(
            MeterProvider(metric_readers=[reader]), task_backends=["default", "second"]
        )
    try:
        with backend_on(alias), caplog.at_level(logging.WARNING, logger="lockkit"):  # "second" is gone now
            text = generate_latest(registry).decode()  # raised InvalidTaskBackend before
            assert 'lockkit_tasks_oldest_ready_age_seconds{backend="default"} 0.0' in text
            second = registry.get_sample_value(
                "lockkit_tasks_oldest_ready_age_seconds", {"backend": "second"}
            )
            assert second is not None
            assert math.isnan(second)
            data = reader.get_metrics_data()
            assert data is not None
            points = [
                point.attributes
                for resource in data.resource_metrics
                for scope in resource.scope_metrics
                for metric in scope.metrics
                if metric.name == "lockkit.tasks.oldest_ready_age"
                for point in metric.data.data_points
            ]
            assert points == [{"lockkit.tasks.backend": "default"}]
        logged = Counter(r.module for r in caplog.records if "'second' could not be read" in r.getMessage())
        assert logged == {"prometheus": 2, "otel": 1}, (
            caplog.text
        )  # two scrapes of the registry, one collection
    finally:
        metrics.uninstall()
        tracked.uninstall()
