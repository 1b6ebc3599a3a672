"""OpenTelemetry spans for locked operations (one per operation, one per attempt) and task metrics (``otel`` extra).

``install()`` connects receivers to ``lockkit.signals``; nothing is traced (and nothing is measured) until it is
called. Only ``opentelemetry-api`` is needed: spans go to whatever tracer provider the application configured
(the SDK and an exporter are the application's choice). Attribute names follow the stable OpenTelemetry database
semantic conventions (semconv 1.44.0): ``db.system.name`` (which replaced the deprecated ``db.system``),
``db.namespace``, ``db.response.status_code`` (the SQLSTATE or vendor code) and ``error.type``; lockkit's own are
under ``lockkit.``. See https://opentelemetry.io/docs/specs/semconv/database/database-spans/.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections
from opentelemetry import context, metrics, trace

from lockkit import signals
from lockkit.contrib._task_backends import checked_task_backends
from lockkit.errors import LockError

SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"

logger = logging.getLogger("lockkit")

# Django's vendor name -> db.system.name (stable values, and the registry's for SQLite and Oracle).
_SYSTEMS = {"postgresql": "postgresql", "sqlite": "sqlite", "oracle": "oracle.db"}


@dataclass
class _Open:
    kind: str
    span: trace.Span
    token: object
    lock_wait: float = 0.0
    children_wait: list[float] = field(default_factory=list)


_open: ContextVar[tuple[_Open, ...]] = ContextVar("lockkit_otel_spans", default=())


def db_system_name(alias: str) -> str:
    """The ``db.system.name`` of an alias's database: ``postgresql``, ``mariadb``, ``mysql``, ``sqlite``..."""
    connection = connections[alias]
    if connection.vendor == "mysql":
        is_mariadb = connection.connection is not None and getattr(connection, "mysql_is_mariadb", False)
        return "mariadb" if is_mariadb else "mysql"
    return _SYSTEMS.get(connection.vendor, connection.vendor)


def _error_attributes(span: trace.Span, failure: Any, error: BaseException | None) -> None:
    if error is None:
        return
    code = error.sqlstate if isinstance(error, LockError) else None
    if code:
        span.set_attribute("db.response.status_code", str(code))
    if failure is not None:
        span.set_attribute("lockkit.failure", failure.value)
    span.set_attribute("error.type", str(code) if code else type(error).__qualname__)
    span.record_exception(error)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(error)[:200]))


def _push(kind: str, span: trace.Span) -> None:
    token = context.attach(trace.set_span_in_context(span))
    _open.set((*_open.get(), _Open(kind, span, token)))


def _pop(kind: str) -> _Open | None:
    stack = _open.get()
    if not stack or stack[-1].kind != kind:
        return None  # installed in the middle of an operation: its start was not seen
    top = stack[-1]
    _open.set(stack[:-1])
    context.detach(top.token)  # type: ignore[arg-type]
    return top


class Tracing:
    """The receivers ``install()`` connected; ``uninstall()`` disconnects them."""

    def __init__(self, tracer: trace.Tracer) -> None:
        """Use ``tracer`` for every span."""
        self.tracer = tracer
        self._connected: list[tuple[Any, Any]] = []

    def _connect(self, signal: Any, receiver: Any) -> None:
        signal.connect(receiver, weak=False)
        self._connected.append((signal, receiver))

    def install(self) -> Tracing:
        """Connect the receivers to ``lockkit.signals``."""
        self._connect(signals.operation_started, self.operation_started)
        self._connect(signals.attempt_started, self.attempt_started)
        self._connect(signals.attempt_finished, self.attempt_finished)
        self._connect(signals.operation_retried, self.operation_retried)
        self._connect(signals.operation_finished, self.operation_finished)
        self._connect(signals.lock_acquired, self.lock_acquired)
        return self

    def uninstall(self) -> None:
        """Disconnect the receivers (spans already open end normally)."""
        for signal, receiver in self._connected:
            signal.disconnect(receiver)
        self._connected.clear()

    def operation_started(self, sender: object, *, operation: str, alias: str, **kwargs: Any) -> None:
        """Start the operation's span (kind INTERNAL: it spans a transaction and its retries)."""
        span = self.tracer.start_span(
            f"lockkit {operation}", attributes={"lockkit.operation": operation, "lockkit.alias": alias}
        )
        _push("operation", span)

    def attempt_started(
        self, sender: object, *, operation: str, alias: str, attempt: int, **kwargs: Any
    ) -> None:
        """Start an attempt's span, a child of the operation's."""
        span = self.tracer.start_span(
            f"lockkit {operation} attempt",
            attributes={"lockkit.operation": operation, "lockkit.alias": alias, "lockkit.attempt": attempt},
        )
        _push("attempt", span)

    def lock_acquired(self, sender: object, *, wait: float, rows: int, model: Any, **kwargs: Any) -> None:
        """Add the locking statement's time to the current attempt's lock wait, and an event."""
        stack = _open.get()
        if not stack:
            return
        stack[-1].lock_wait += wait
        stack[-1].span.add_event(
            "lockkit.lock_acquired",
            {
                "lockkit.lock_wait": wait,
                "lockkit.rows": rows,
                "lockkit.model": model._meta.label if model else "",
            },
        )

    def attempt_finished(
        self, sender: object, *, alias: str, failure: Any, error: BaseException | None, **kwargs: Any
    ) -> None:
        """End the attempt's span with its lock wait and failure."""
        top = _pop("attempt")
        if top is None:
            return
        top.span.set_attribute("lockkit.lock_wait", top.lock_wait)
        top.span.set_attribute("db.system.name", db_system_name(alias))
        _error_attributes(top.span, failure, error)
        top.span.end()
        stack = _open.get()
        if stack and stack[-1].kind == "operation":
            stack[-1].children_wait.append(top.lock_wait)

    def operation_retried(
        self, sender: object, *, attempt: int, failure: Any, wait: float, **kwargs: Any
    ) -> None:
        """Record the retry as an event of the operation's span."""
        stack = _open.get()
        if stack and stack[-1].kind == "operation":
            stack[-1].span.add_event(
                "lockkit.retry",
                {
                    "lockkit.attempt": attempt,
                    "lockkit.failure": failure.value if failure else "",
                    "lockkit.wait": wait,
                },
            )

    def operation_finished(
        self,
        sender: object,
        *,
        alias: str,
        attempts: int,
        failure: Any,
        error: BaseException | None,
        **kwargs: Any,
    ) -> None:
        """End the operation's span with the attempts, the total lock wait and the failure."""
        top = _pop("operation")
        if top is None:
            return
        top.span.set_attribute("lockkit.attempts", attempts)
        top.span.set_attribute("lockkit.lock_wait", sum(top.children_wait) + top.lock_wait)
        top.span.set_attribute("db.system.name", db_system_name(alias))
        top.span.set_attribute("db.namespace", str(connections[alias].settings_dict.get("NAME") or ""))
        _error_attributes(top.span, failure, error)
        top.span.end()


def install(tracer_provider: trace.TracerProvider | None = None) -> Tracing:
    """Trace every locked operation from now on: one span per operation and one per attempt.

    Spans: ``lockkit <operation>`` (attributes ``lockkit.operations.operation``, ``lockkit.alias``, ``lockkit.attempts``,
    ``lockkit.lock_wait`` in seconds, ``db.system.name``, ``db.namespace``; events ``lockkit.retries``) and its
    children ``lockkit <operation> attempt`` (``lockkit.attempt``, ``lockkit.lock_wait``, events
    ``lockkit.lock_acquired``). A failed span gets ``lockkit.failure`` (a ``lockkit.Failure`` value),
    ``db.response.status_code``, ``error.type``, the exception and an ERROR status. The spans are current while
    the operation runs, so spans of database instrumentation (psycopg, Django) nest under the attempt.

    Args:
        tracer_provider: The provider to get the tracer from; default the global one.

    Returns:
        The installed ``Tracing``; ``uninstall()`` disconnects it. Call ``install()`` once (e.g. in
        ``AppConfig.ready()`` or through ``settings.LOCKKIT["OBSERVERS"]``): each call adds receivers.
    """
    tracer = trace.get_tracer("lockkit", schema_url=SCHEMA_URL, tracer_provider=tracer_provider)
    return Tracing(tracer).install()


class TaskMetrics:
    """Task outcomes and the oldest ready task's age through an OpenTelemetry meter (``install_task_metrics``).

    Attributes:
        tasks: The counter ``lockkit.tasks`` (attributes ``lockkit.tasks.backend``, ``lockkit.tasks.queue``,
            ``lockkit.tasks.outcome``: ``succeeded``, ``failed`` (final), ``retried``, ``lost``).
    """

    def __init__(self, meter: metrics.Meter, task_backends: Sequence[str]) -> None:
        """Create the instruments (nothing is counted until ``install()``).

        Raises:
            TypeError, ValueError: ``task_backends`` is refused, as by ``install_task_metrics()``.
        """
        self.task_backends = checked_task_backends(task_backends)
        self.tasks = meter.create_counter(
            "lockkit.tasks", unit="{task}", description="Task attempts by outcome"
        )
        meter.create_observable_gauge(
            "lockkit.tasks.oldest_ready_age",
            callbacks=[self._observe],
            unit="s",
            description="Seconds the oldest ready task has waited (0 when none is ready)",
        )
        self._installed = False

    def install(self) -> TaskMetrics:
        """Connect the receiver to ``lockkit.signals.task_counted``."""
        signals.task_counted.connect(self._counted, weak=False)
        self._installed = True
        return self

    def uninstall(self) -> None:
        """Disconnect the receiver; the gauge reports nothing from now on."""
        signals.task_counted.disconnect(self._counted)
        self._installed = False

    def _counted(self, sender: object, *, backend: str, queue: str, outcome: str, **kwargs: Any) -> None:
        attributes = {
            "lockkit.tasks.backend": backend,
            "lockkit.tasks.queue": queue,
            "lockkit.tasks.outcome": outcome,
        }
        self.tasks.add(1, attributes)

    def _observe(self, options: metrics.CallbackOptions) -> Iterator[metrics.Observation]:
        from lockkit.tasks.tally import oldest_ready_age  # Django 6 only: imported when observed

        for backend in self.task_backends if self._installed else ():
            try:
                age = oldest_ready_age(backend)
            except Exception as failure:  # the other backends are still observed
                # A DatabaseError; or settings.TASKS changed since install (InvalidTaskBackend, TypeError).
                log = logger.warning if isinstance(failure, DatabaseError) else logger.error
                log("lockkit: the oldest ready task of %r could not be read: %r", backend, failure)
                continue
            yield metrics.Observation(0.0 if age is None else age, {"lockkit.tasks.backend": backend})


def install_task_metrics(
    meter_provider: metrics.MeterProvider | None = None, *, task_backends: Sequence[str] = ("default",)
) -> TaskMetrics:
    """Count task outcomes of ``lockkit_worker`` processes and observe the oldest ready task's age.

    Instruments: the counter ``lockkit.tasks`` (one per recorded attempt outcome) and the observable gauge
    ``lockkit.tasks.oldest_ready_age`` (seconds, attribute ``lockkit.tasks.backend``; one query per backend at
    each collection, on the collecting thread's connection; a backend that cannot be read, its database down
    or its alias gone from ``settings.TASKS``, is skipped and logged). Django 6 (``lockkit.tasks``).

    Args:
        meter_provider: The provider to get the meter from; default the global one.
        task_backends: Aliases of ``settings.TASKS`` (``lockkit.tasks.DatabaseBackend``s) whose oldest ready
            task is observed.

    Returns:
        The installed ``TaskMetrics``; ``uninstall()`` disconnects it.

    Raises:
        TypeError: ``task_backends`` is a ``str`` or not iterable, or holds something that is not a ``str``.
        ValueError: an alias of ``task_backends`` is not in ``settings.TASKS``, or its backend is not a
            ``lockkit.tasks.DatabaseBackend``.
    """
    meter = metrics.get_meter("lockkit", schema_url=SCHEMA_URL, meter_provider=meter_provider)
    return TaskMetrics(meter, task_backends).install()


__all__ = ["SCHEMA_URL", "TaskMetrics", "Tracing", "db_system_name", "install", "install_task_metrics"]
