"""OpenTelemetry spans (SDK in-memory exporter) and Prometheus metrics (a fresh registry) after contended runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from lockkit import events
from lockkit.claims import claim_next, complete
from lockkit.contrib import otel, prometheus
from lockkit_tests.models import Job
from lockkit_tests.support.observe_helpers import deadlock_pair, timed_out_twice

pytestmark = pytest.mark.contention


def qualified(func: Any) -> str:
    """The name lockkit gives an operation: the function's module and qualified name."""
    return f"{func.__module__}.{func.__qualname__}"


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = otel.install(tracer_provider=provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()
        assert not events.observing()


@pytest.fixture
def metrics() -> Iterator[tuple[prometheus.Metrics, CollectorRegistry]]:
    registry = CollectorRegistry()
    installed = prometheus.install(registry)
    try:
        yield installed, registry
    finally:
        installed.uninstall()
        assert not events.observing()


def test_otel_one_span_per_operation_and_per_attempt_for_a_retried_deadlock(
    spans: InMemorySpanExporter,
) -> None:
    transfer, results = deadlock_pair()
    assert all(isinstance(r, int) for r in results), results
    finished = spans.get_finished_spans()
    name = f"lockkit {qualified(transfer)}"
    operations = [s for s in finished if s.name == name]
    attempts = [s for s in finished if s.name == f"{name} attempt"]
    assert len(operations) == 2
    assert len(attempts) == sum(results)
    by_id = {s.context.span_id: s for s in operations}
    for span in attempts:
        assert span.parent is not None
        assert span.parent.span_id in by_id
        assert attrs(span)["db.system.name"] == "postgresql"
        assert attrs(span)["lockkit.alias"] == "default"
        assert attrs(span)["lockkit.lock_wait"] >= 0
    failed = [s for s in attempts if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == sum(results) - 2
    for span in failed:
        assert attrs(span)["lockkit.failure"] == "deadlock_detected"
        assert attrs(span)["db.response.status_code"] == attrs(span)["error.type"] == "40P01"
    for span in operations:
        assert span.status.status_code is StatusCode.UNSET
        assert attrs(span)["lockkit.attempts"] in results
        assert attrs(span)["db.namespace"]  # the test database's name
        children = [a for a in attempts if a.parent is not None and a.parent.span_id == span.context.span_id]
        assert sorted(int(attrs(a)["lockkit.attempt"]) for a in children) == list(
            range(1, int(attrs(span)["lockkit.attempts"]) + 1)
        )
        retries = [e for e in span.events if e.name == "lockkit.retry"]
        assert len(retries) == int(attrs(span)["lockkit.attempts"]) - 1


def test_otel_a_lock_timeout_given_up_is_an_error_span(spans: InMemorySpanExporter) -> None:
    take, _error = timed_out_twice()
    (operation,) = [s for s in spans.get_finished_spans() if s.name == f"lockkit {qualified(take)}"]
    assert operation.status.status_code is StatusCode.ERROR
    assert (attrs(operation)["lockkit.attempts"], attrs(operation)["lockkit.failure"]) == (
        2,
        "lock_timeout",
    )
    assert attrs(operation)["error.type"] == "55P03"


def test_prometheus_counters_and_histograms_after_contended_runs(
    metrics: tuple[prometheus.Metrics, CollectorRegistry],
) -> None:
    _, registry = metrics
    transfer, results = deadlock_pair()
    take, _ = timed_out_twice()

    def value(name: str, labels: dict[str, str]) -> float:
        found = registry.get_sample_value(name, labels)
        assert found is not None, (name, labels)
        return found

    retries = sum(results) - 2
    assert (
        value(
            "lockkit_operations_total",
            {"operation": qualified(transfer), "alias": "default", "outcome": "ok"},
        )
        == 2
    )
    assert (
        value(
            "lockkit_retries_total",
            {"operation": qualified(transfer), "alias": "default", "failure": "deadlock_detected"},
        )
        == retries
    )
    assert value("lockkit_failures_total", {"alias": "default", "failure": "deadlock_detected"}) == retries
    assert value("lockkit_failures_total", {"alias": "default", "failure": "lock_timeout"}) == 2
    assert (
        value(
            "lockkit_operations_total",
            {"operation": qualified(take), "alias": "default", "outcome": "lock_timeout"},
        )
        == 1
    )
    assert (
        value(
            "lockkit_give_ups_total",
            {"operation": qualified(take), "alias": "default", "failure": "lock_timeout"},
        )
        == 1
    )
    assert value("lockkit_attempts_total", {"operation": qualified(take), "alias": "default"}) == 2
    labels = {"operation": qualified(take), "alias": "default"}
    assert value("lockkit_operation_duration_seconds_count", labels) == 1
    assert value("lockkit_operation_duration_seconds_sum", labels) >= 0.4  # two waits of 0.2 s
    lock_labels = {"alias": "default", "model": "lockkit_tests.Stock"}
    # Every transfer attempt locked a first row, and each finished transfer a second one.
    assert value("lockkit_lock_wait_seconds_count", lock_labels) == sum(results) + 2
    assert value("lockkit_lock_wait_seconds_bucket", {**lock_labels, "le": "+Inf"}) == sum(results) + 2
    # The survivor's locks were free (well under 100 ms); the deadlock victim's second lock waited.
    assert value("lockkit_lock_wait_seconds_bucket", {**lock_labels, "le": "0.05"}) < sum(results) + 2


@pytest.mark.django_db(transaction=True)
def test_prometheus_claims_counters(metrics: tuple[prometheus.Metrics, CollectorRegistry]) -> None:
    _, registry = metrics
    Job.objects.bulk_create([Job(name=f"j{i}") for i in range(3)])
    claims = claim_next(Job.objects.filter(state="pending"), worker="w", lease=30, limit=2)
    complete(claims[0], set={"state": "done"})
    labels = {"model": "lockkit_tests.Job", "alias": "default"}
    assert registry.get_sample_value("lockkit_claims_total", {"event": "made", **labels}) == 2
    assert registry.get_sample_value("lockkit_claims_total", {"event": "completed", **labels}) == 1
