"""Where the lifecycle of an operation, a lock and a claim tells ``lockkit.signals`` what happened (private).

Every function here first checks whether the signal it sends has receivers (a list attribute, no call), and
measures or allocates nothing when none is connected: an unobserved operation runs exactly as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Protocol, TypeVar

from lockkit import signals
from lockkit.errors import Failure, LockError

R = TypeVar("R")

logger = logging.getLogger("lockkit.signals")


def send(signal: Any, sender: object, **kwargs: Any) -> None:
    """Send ``signal`` to every receiver, logging (never raising) a receiver's exception.

    ``Signal.send_robust``: a broken metrics or tracing receiver must not fail, roll back or retry the operation
    it observes (which may already have committed), nor keep the other receivers from hearing it.
    """
    for receiver, response in signal.send_robust(sender, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "lockkit: a receiver of a lockkit signal raised; the operation goes on: %r",
                receiver,
                exc_info=response,
            )


class RetryEvent(Protocol):
    """The fields of ``lockkit.retries.RetryEvent`` these hooks read (retry imports this module, not the reverse)."""

    @property
    def attempt(self) -> int: ...  # noqa: D102
    @property
    def failure(self) -> Failure | None: ...  # noqa: D102
    @property
    def alias(self) -> str: ...  # noqa: D102
    @property
    def wait(self) -> float: ...  # noqa: D102
    @property
    def error(self) -> BaseException | None: ...  # noqa: D102
    @property
    def sqlstate(self) -> str | None: ...  # noqa: D102
    @property
    def operation(self) -> str: ...  # noqa: D102


# The operation being observed in this thread or task: the sender of retried/gave_up, which tenacity's hooks send.
_sender: ContextVar[object] = ContextVar("lockkit_observed_operation", default=None)


def observing() -> bool:
    """Whether any operation signal has a receiver (the hot path's only cost when none has)."""
    return bool(
        signals.operation_finished.receivers
        or signals.operation_started.receivers
        or signals.attempt_finished.receivers
        or signals.attempt_started.receivers
        or signals.operation_retried.receivers
        or signals.operation_gave_up.receivers
    )


def failure_of(error: BaseException | None) -> Failure | None:
    """The classified kind of a lockkit error, else ``None``."""
    return error.failure if isinstance(error, LockError) else None


class ObservedOperation:
    """One observed ``locked_operation`` call: sends started/finished and wraps its attempts.

    Created only when ``observing()`` is true, so an unobserved call allocates none of this.
    """

    def __init__(
        self,
        sender: object,
        operation: str,
        alias: str,
        unwrap: Callable[[BaseException], BaseException],
    ) -> None:
        """Remember the call; ``unwrap`` turns lockkit's private carrier of a post-commit error into the error."""
        self.sender = sender
        self.operation = operation
        self.alias = alias
        self.attempts = 0
        self._unwrap = unwrap
        self._started = 0.0
        self._token: Any = None

    def __enter__(self) -> ObservedOperation:
        """Send ``operation_started`` and start the clock."""
        self._token = _sender.set(self.sender)
        self._started = time.perf_counter()
        if signals.operation_started.receivers:
            send(signals.operation_started, self.sender, operation=self.operation, alias=self.alias)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Send ``operation_finished`` with the attempts, the failure and the duration."""
        duration = time.perf_counter() - self._started
        _sender.reset(self._token)
        if signals.operation_finished.receivers:
            send(
                signals.operation_finished,
                self.sender,
                operation=self.operation,
                alias=self.alias,
                attempts=self.attempts,
                failure=failure_of(exc),
                error=exc,
                duration=duration,
            )

    def wrap(self, attempt: Callable[[str, int, Any, Any], R]) -> Callable[[str, int, Any, Any], R]:
        """Return ``attempt`` sending ``attempt_started``/``attempt_finished`` around each call."""

        def observed(alias: str, number: int, args: Any, kwargs: Any) -> R:
            self.attempts = number
            if signals.attempt_started.receivers:
                send(
                    signals.attempt_started,
                    self.sender,
                    operation=self.operation,
                    alias=alias,
                    attempt=number,
                )
            started = time.perf_counter()
            try:
                result = attempt(alias, number, args, kwargs)
            except BaseException as exc:
                self._attempt_finished(number, self._unwrap(exc), time.perf_counter() - started)
                raise
            self._attempt_finished(number, None, time.perf_counter() - started)
            return result

        return observed

    def _attempt_finished(self, number: int, error: BaseException | None, duration: float) -> None:
        if signals.attempt_finished.receivers:
            send(
                signals.attempt_finished,
                self.sender,
                operation=self.operation,
                alias=self.alias,
                attempt=number,
                failure=failure_of(error),
                error=error,
                duration=duration,
            )


def retried(event: RetryEvent) -> None:
    """Send ``operation_retried`` for a retry the policy decided (called from tenacity's ``before_sleep``)."""
    if signals.operation_retried.receivers:
        send(
            signals.operation_retried,
            _sender.get(),
            operation=event.operation,
            alias=event.alias,
            attempt=event.attempt,
            failure=event.failure,
            sqlstate=event.sqlstate,
            wait=event.wait,
            error=event.error,
        )


def gave_up(event: RetryEvent) -> None:
    """Send ``operation_gave_up`` when the policy stops on a failure (called from tenacity's give-up hook)."""
    if signals.operation_gave_up.receivers:
        send(
            signals.operation_gave_up,
            _sender.get(),
            operation=event.operation,
            alias=event.alias,
            attempts=event.attempt,
            failure=event.failure,
            sqlstate=event.sqlstate,
            error=event.error,
        )


def timed_lock(sender: object, scope: Any, model: Any, take: Callable[[], R], rows: Callable[[R], int]) -> R:
    """Run ``take`` (a locking statement) and send ``lock_acquired`` with its duration, when observed."""
    if not signals.lock_acquired.receivers:
        return take()
    started = time.perf_counter()
    result = take()
    wait = time.perf_counter() - started
    send(
        signals.lock_acquired,
        sender,
        alias=scope.alias,
        scope=scope,
        model=model,
        rows=rows(result),
        wait=wait,
    )
    return result


def claims_event(signal: Any, sender: object, claims: Iterable[Any], **extra: Any) -> None:
    """Send a claim signal for ``claims`` (grouped by nothing: they share one model and alias), when observed."""
    if not signal.receivers:
        return
    listed = list(claims)
    if not listed:
        return
    send(signal, sender, claims=listed, model=listed[0].model, alias=listed[0].alias, **extra)


def task_counted(sender: object, *, backend: str, queue: str, alias: str, outcome: str) -> None:
    """Send ``task_counted`` for one task attempt's outcome, when observed."""
    if signals.task_counted.receivers:
        send(signals.task_counted, sender, backend=backend, queue=queue, alias=alias, outcome=outcome)
