"""Prometheus metrics for locked operations, lock waits and claims (the ``prometheus`` extra).

``install()`` registers the metrics and connects receivers to ``lockkit.signals``; until then nothing is counted
or measured. Expose them as usual for ``prometheus-client`` (``generate_latest()`` in a view, or
``start_http_server``). See https://prometheus.github.io/client_python/.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from lockkit import signals
from lockkit.contrib._task_backends import checked_task_backends

#: Seconds: from a millisecond to the default 5 s lock timeout and beyond.
LOCK_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DURATION_BUCKETS = LOCK_WAIT_BUCKETS
#: How many distinct ``operation`` label values are kept; later ones are counted as ``OTHER_OPERATIONS``.
MAX_OPERATIONS = 1000
OTHER_OPERATIONS = "other"

logger = logging.getLogger("lockkit")


def _outcome(failure: Any, error: BaseException | None) -> str:
    if error is None:
        return "ok"
    return str(failure.value) if failure is not None else "error"


class Metrics:
    """lockkit's Prometheus metrics and the receivers that update them.

    Attributes:
        operations: ``lockkit_operations_total{operation, alias, outcome}``; ``outcome`` is ``ok``, a
            ``lockkit.Failure`` value (``lock_timeout``, ``deadlock_detected``...) or ``error``.
        attempts: ``lockkit_attempts_total{operation, alias}``.
        retries: ``lockkit_retries_total{operation, alias, failure}``.
        failures: ``lockkit_failures_total{alias, failure}``: failed attempts by classified kind.
        give_ups: ``lockkit_give_ups_total{operation, alias, failure}``.
        duration: ``lockkit_operation_duration_seconds{operation, alias}``: whole calls, retries included.
        lock_wait: ``lockkit_lock_wait_seconds{alias, model}``: the locking statements lockkit runs
            (``get``, ``lock_all``, ``advisory_lock``); ``model`` is ``advisory`` for advisory locks.
        claims: ``lockkit_claims_total{event, model, alias}``: claims ``made``, ``completed``, ``released``,
            ``reclaimed`` and ``stale``.
        tasks: ``lockkit_tasks_total{backend, queue, outcome}``: task attempts recorded by ``lockkit_worker``
            processes, by ``outcome``: ``succeeded``, ``failed`` (final), ``retried``, ``lost``.
        oldest_ready: ``lockkit_tasks_oldest_ready_age_seconds{backend}``: how long the oldest ready task of
            each of ``task_backends`` has waited (0 when none is ready; NaN when the database could not be
            asked), read by one query on the scraping thread at each scrape.

    ``operation`` is the decorated function's qualified name (``module.qualname``, never a ``repr()``: see
    ``lockkit.operations.naming``); at most ``max_operations`` distinct values are kept, later ones are counted
    under ``"other"``, so the number of time series stays bounded.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = REGISTRY,
        namespace: str = "lockkit",
        *,
        max_operations: int = MAX_OPERATIONS,
        task_backends: Sequence[str] = (),
    ) -> None:
        """Create (and register in ``registry``) the metrics; the arguments are checked first (no SQL).

        Raises:
            TypeError, ValueError: ``max_operations`` is not a positive ``int``; ``task_backends`` is not a list
                of aliases of ``lockkit.tasks.DatabaseBackend``s in ``settings.TASKS`` (as ``install()``).
        """
        backends = checked_task_backends(task_backends)
        if isinstance(max_operations, bool) or not isinstance(max_operations, int):
            raise TypeError(f"max_operations must be an int, not {type(max_operations).__name__}")
        if max_operations < 1:
            raise ValueError(f"max_operations must be at least 1, got {max_operations}")
        self._max_operations = max_operations
        self._operations: set[str] = set()
        self._operations_lock = threading.Lock()
        self.operations = Counter(
            "operations", "Locked operations by outcome", ["operation", "alias", "outcome"],
            namespace=namespace, registry=registry,
        )  # fmt: skip
        self.attempts = Counter(
            "attempts",
            "Attempts of locked operations",
            ["operation", "alias"],
            namespace=namespace,
            registry=registry,
        )
        self.retries = Counter(
            "retries", "Retried attempts by failure kind", ["operation", "alias", "failure"],
            namespace=namespace, registry=registry,
        )  # fmt: skip
        self.failures = Counter(
            "failures",
            "Failed attempts by failure kind",
            ["alias", "failure"],
            namespace=namespace,
            registry=registry,
        )
        self.give_ups = Counter(
            "give_ups", "Operations the retry policy gave up on", ["operation", "alias", "failure"],
            namespace=namespace, registry=registry,
        )  # fmt: skip
        self.duration = Histogram(
            "operation_duration_seconds", "Duration of locked operations, retries included", ["operation", "alias"],
            namespace=namespace, registry=registry, buckets=DURATION_BUCKETS,
        )  # fmt: skip
        self.lock_wait = Histogram(
            "lock_wait_seconds", "Time of the locking statements lockkit runs", ["alias", "model"],
            namespace=namespace, registry=registry, buckets=LOCK_WAIT_BUCKETS,
        )  # fmt: skip
        self.claims = Counter(
            "claims",
            "Job claims by event",
            ["event", "model", "alias"],
            namespace=namespace,
            registry=registry,
        )
        self.tasks = Counter(
            "tasks", "Task attempts recorded by workers, by outcome", ["backend", "queue", "outcome"],
            namespace=namespace, registry=registry,
        )  # fmt: skip
        self.oldest_ready = Gauge(
            "tasks_oldest_ready_age_seconds", "Seconds the oldest ready task has waited", ["backend"],
            namespace=namespace, registry=registry,
        )  # fmt: skip
        for backend in backends:
            self.oldest_ready.labels(backend).set_function(_oldest_ready(backend))
        self._registry = registry
        self._connected: list[tuple[Any, Any]] = []

    def install(self) -> Metrics:
        """Connect the receivers to ``lockkit.signals``."""
        pairs: list[tuple[Any, Any]] = [
            (signals.attempt_finished, self._attempt_finished),
            (signals.operation_retried, self._retried),
            (signals.operation_gave_up, self._gave_up),
            (signals.operation_finished, self._finished),
            (signals.lock_acquired, self._lock_acquired),
            (signals.claim_made, self._claims("made")),
            (signals.claim_completed, self._claims("completed")),
            (signals.claim_released, self._claims("released")),
            (signals.claim_stale, self._claims("stale")),
            (signals.claim_reclaimed, self._reclaimed),
            (signals.task_counted, self._task_counted),
        ]
        for signal, receiver in pairs:
            signal.connect(receiver, weak=False)
        self._connected = pairs
        return self

    def uninstall(self) -> None:
        """Disconnect the receivers and unregister the metrics from their registry."""
        for signal, receiver in self._connected:
            signal.disconnect(receiver)
        self._connected = []
        if self._registry is not None:
            for metric in (
                self.operations, self.attempts, self.retries, self.failures, self.give_ups,
                self.duration, self.lock_wait, self.claims, self.tasks, self.oldest_ready,
            ):  # fmt: skip
                self._registry.unregister(metric)
            self._registry = None

    def _operation(self, name: str) -> str:
        # Receivers run in many threads at once: the set of label values is shared.
        with self._operations_lock:
            if name in self._operations:
                return name
            if len(self._operations) < self._max_operations:
                self._operations.add(name)
                return name
        return OTHER_OPERATIONS

    def _attempt_finished(
        self, sender: object, *, operation: str, alias: str, failure: Any, **kwargs: Any
    ) -> None:
        self.attempts.labels(self._operation(operation), alias).inc()
        if failure is not None:
            self.failures.labels(alias, failure.value).inc()

    def _retried(self, sender: object, *, operation: str, alias: str, failure: Any, **kwargs: Any) -> None:
        self.retries.labels(self._operation(operation), alias, failure.value if failure else "error").inc()

    def _gave_up(self, sender: object, *, operation: str, alias: str, failure: Any, **kwargs: Any) -> None:
        self.give_ups.labels(self._operation(operation), alias, failure.value if failure else "error").inc()

    def _finished(
        self,
        sender: object,
        *,
        operation: str,
        alias: str,
        failure: Any,
        error: BaseException | None,
        duration: float,
        **kwargs: Any,
    ) -> None:
        self.operations.labels(self._operation(operation), alias, _outcome(failure, error)).inc()
        self.duration.labels(self._operation(operation), alias).observe(duration)

    def _lock_acquired(self, sender: object, *, alias: str, model: Any, wait: float, **kwargs: Any) -> None:
        self.lock_wait.labels(alias, model._meta.label if model is not None else "advisory").observe(wait)

    def _claims(self, event: str) -> Any:
        def receiver(sender: object, *, claims: list[Any], model: Any, alias: str, **kwargs: Any) -> None:
            self.claims.labels(event, model._meta.label, alias).inc(len(claims))

        return receiver

    def _reclaimed(self, sender: object, *, model: Any, alias: str, count: int, **kwargs: Any) -> None:
        self.claims.labels("reclaimed", model._meta.label, alias).inc(count)

    def _task_counted(self, sender: object, *, backend: str, queue: str, outcome: str, **kwargs: Any) -> None:
        self.tasks.labels(backend, queue, outcome).inc()


def _oldest_ready(backend: str) -> Any:
    from lockkit.tasks.tally import oldest_ready_age  # Django 6 only: imported when a backend is named

    def read() -> float:
        try:
            age = oldest_ready_age(backend)
        except Exception as failure:  # one gauge failing must not fail the scrape
            # A DatabaseError; or settings.TASKS changed since install() (InvalidTaskBackend, TypeError).
            log = logger.warning if isinstance(failure, DatabaseError) else logger.error
            log("lockkit: the oldest ready task of %r could not be read: %r", backend, failure)
            return math.nan
        return 0.0 if age is None else age

    return read


def install(
    registry: CollectorRegistry | None = REGISTRY,
    *,
    namespace: str = "lockkit",
    max_operations: int = MAX_OPERATIONS,
    task_backends: Sequence[str] = (),
) -> Metrics:
    """Count and time every locked operation, lock, claim and task outcome from now on, in ``registry``.

    Args:
        registry: Where the metrics are registered; default ``prometheus_client.REGISTRY`` (what
            ``generate_latest()`` and ``start_http_server`` expose).
        namespace: The metric name prefix.
        max_operations: How many distinct ``operation`` label values to keep (default 1000); later operations
            are counted under ``"other"``.
        task_backends: Aliases of ``settings.TASKS`` (``lockkit.tasks.DatabaseBackend``s, Django 6) whose oldest
            ready task's age is exported (one query per backend per scrape; NaN, logged, when it cannot be
            read); default none.

    Returns:
        The installed ``Metrics``; ``uninstall()`` disconnects and unregisters them.

    Raises:
        TypeError, ValueError: ``max_operations`` is not a positive ``int``.
        TypeError: ``task_backends`` is a ``str`` or not iterable, or holds something that is not a ``str``.
        ValueError: an alias of ``task_backends`` is not in ``settings.TASKS``, or its backend is not a
            ``lockkit.tasks.DatabaseBackend``; the metrics are already registered in ``registry`` (installed
            twice). Nothing is registered when an argument is refused.
    """
    return Metrics(registry, namespace, max_operations=max_operations, task_backends=task_backends).install()


__all__ = [
    "DURATION_BUCKETS",
    "LOCK_WAIT_BUCKETS",
    "MAX_OPERATIONS",
    "OTHER_OPERATIONS",
    "Metrics",
    "install",
]
