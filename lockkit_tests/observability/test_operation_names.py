"""What a ``locked_operation`` is called in signals, Prometheus labels and span names: its qualified name, never a
``repr()`` (a partial's bound e-mail address, a memory address), and a bounded set of label values."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

import lockkit
from lockkit.contrib import otel, prometheus
from lockkit.operations.naming import MAX_LENGTH, operation_name
from lockkit_tests.models import Item

MODULE = __name__
EMAIL = "alice.secret@example.com"
ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def rename(pk: int, name: str) -> str:
    """Lock the item and rename it: the body of every operation below."""
    item = lockkit.current_scope().get(Item, pk=pk)
    item.name = name
    item.save(update_fields=["name"])
    return name


class Renamer:
    """A callable object; its repr() carries its address and its bound e-mail address."""

    def __init__(self, email: str) -> None:
        self.email = email

    def __call__(self, pk: int) -> str:
        return rename(pk, self.email)

    def method(self, pk: int) -> str:
        return rename(pk, self.email)


def _callables() -> dict[str, tuple[Any, str]]:
    """Each kind of callable, and the name lockkit must give it."""
    renamer = Renamer(EMAIL)
    return {
        "partial": (functools.partial(rename, name=EMAIL), f"{MODULE}.rename"),
        "nested partial": (functools.partial(functools.partial(rename), name=EMAIL), f"{MODULE}.rename"),
        "callable object": (renamer, f"{MODULE}.Renamer"),
        "lambda": (lambda pk: rename(pk, EMAIL), f"{MODULE}._callables.<locals>.<lambda>"),
        "bound method": (renamer.method, f"{MODULE}.Renamer.method"),
        "partial of a bound method": (functools.partial(renamer.method), f"{MODULE}.Renamer.method"),
        "wrapping object": (Wrapper(functools.partial(rename, name=EMAIL)), f"{MODULE}.rename"),
    }


class Wrapper:
    """A callable object made to look like the function it wraps (``functools.update_wrapper``)."""

    def __init__(self, func: Any) -> None:
        self.func = func
        functools.update_wrapper(self, func)

    def __call__(self, pk: int) -> str:
        return str(self.func(pk))


def _assert_clean(text: str) -> None:
    assert EMAIL not in text
    assert "example.com" not in text
    assert not ADDRESS.search(text), text
    assert "functools.partial(" not in text
    assert " object at " not in text


@pytest.fixture
def observed() -> Iterator[tuple[CollectorRegistry, InMemorySpanExporter]]:
    registry = CollectorRegistry()
    metrics = prometheus.install(registry)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = otel.install(tracer_provider=provider)
    try:
        yield registry, exporter
    finally:
        tracing.uninstall()
        metrics.uninstall()


@pytest.mark.parametrize("kind", list(_callables()))
def test_the_name_is_the_qualified_name_of_the_code(kind: str) -> None:
    func, expected = _callables()[kind]
    assert repr(func) != expected
    assert operation_name(func) == expected
    _assert_clean(operation_name(func))


def test_a_long_name_is_cut() -> None:
    def func() -> None: ...

    func.__qualname__ = "x" * 1000
    assert operation_name(func) == f"{MODULE}.{'x' * 1000}"[:MAX_LENGTH]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", list(_callables()))
def test_labels_and_span_names_carry_no_repr_no_address_no_bound_argument(
    kind: str, observed: tuple[CollectorRegistry, InMemorySpanExporter]
) -> None:
    registry, exporter = observed
    func, expected = _callables()[kind]
    item = Item.objects.create(name="before")
    operation = lockkit.locked_operation(lock_timeout=5)(func)
    assert operation(item.pk) == EMAIL
    assert Item.objects.get(pk=item.pk).name == EMAIL  # it ran, in a scope

    exposition = generate_latest(registry).decode()
    _assert_clean(exposition)
    labels = {"operation": expected, "alias": "default", "outcome": "ok"}
    assert registry.get_sample_value("lockkit_operations_total", labels) == 1
    assert (
        registry.get_sample_value("lockkit_attempts_total", {"operation": expected, "alias": "default"}) == 1
    )
    spans = exporter.get_finished_spans()
    assert sorted(span.name for span in spans) == [f"lockkit {expected}", f"lockkit {expected} attempt"]
    for span in spans:
        _assert_clean(span.name)
        for value in (span.attributes or {}).values():
            _assert_clean(str(value))
        assert (span.attributes or {})["lockkit.operation"] == expected


@pytest.mark.django_db(transaction=True)
def test_the_operation_label_set_is_bounded() -> None:
    registry = CollectorRegistry()
    metrics = prometheus.install(registry, max_operations=2)
    try:
        item = Item.objects.create(name="before")
        names = []
        for number in range(4):

            def body(pk: int) -> str:
                return rename(pk, "renamed")

            body.__qualname__ = f"generated_{number}"
            names.append(f"{MODULE}.generated_{number}")
            lockkit.locked_operation(lock_timeout=5)(body)(item.pk)
        value = registry.get_sample_value

        def count(operation: str) -> float | None:
            return value(
                "lockkit_operations_total", {"operation": operation, "alias": "default", "outcome": "ok"}
            )

        assert [count(name) for name in names] == [1, 1, None, None]
        assert count(prometheus.OTHER_OPERATIONS) == 2
        assert count(names[0]) == 1  # a known name keeps its own series
    finally:
        metrics.uninstall()


@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (-1, ValueError), (True, TypeError), ("9", TypeError)]
)
def test_max_operations_is_checked(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_operations"):
        prometheus.Metrics(CollectorRegistry(), max_operations=value)
