"""``RetryPolicy``: which locking failures are retried, how often and how long to wait, built on tenacity.

A policy is a frozen value. A call's first attempt runs without tenacity; only when it fails with an error the
policy retries is a fresh ``tenacity.Retrying`` built for that call (a ``Retrying`` holds per-call state and is not
safe to share between threads), and most calls never need one. https://tenacity.readthedocs.io/
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import random
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import tenacity

from lockkit import conf, events
from lockkit.conf import Default
from lockkit.errorcodes.table import code_of
from lockkit.errors import (
    CommitOutcomeUnknown,
    ConnectionLost,
    DatabaseMisconfigured,
    Failure,
    LockError,
    ReadOnlyDatabase,
)
from lockkit.validation import Duration, duration, optional_duration, positive_int

logger = logging.getLogger("lockkit")

R = TypeVar("R")

DEFAULT_RETRY_ON: frozenset[Failure] = frozenset(
    {Failure.DEADLOCK_DETECTED, Failure.SERIALIZATION_FAILURE, Failure.LOCK_TIMEOUT, Failure.CONNECTION_LOST}
)
# Waits after a lost connection, in seconds: "equal jitter" (half fixed, half random) exponential backoff from
# RECONNECT_WAIT_INITIAL doubling up to RECONNECT_WAIT_MAX. Never near zero, so that a fast server restart
# (about 0.4 s from the first refused connection to the first accepted one, measured with pg_ctl restart -m fast)
# is ridden out within four or five waits, well inside the default reconnect_within.
RECONNECT_WAIT_INITIAL = 0.05
RECONNECT_WAIT_MAX = 0.5


@dataclass(frozen=True)
class RetryEvent:
    """What a hook learns about one retry or one give-up.

    Attributes:
        attempt: The number of the attempt that just failed (1-based).
        failure: The failure kind, or ``None`` for an error lockkit does not classify.
        alias: The database alias of the operation.
        wait: Seconds before the next attempt (0.0 on give-up).
        error: The exception the attempt raised (``None`` when a tenacity result predicate asked for the retry).
        sqlstate: Its SQLSTATE or vendor code, when known.
        operation: The qualified name of the decorated function (lockkit's entry point for its own calls).
        doing: What was being done, in words, as the log lines say it ("claiming tasks", "renewing the worker's
            leases on its tasks"); the operation's name for a function you decorated.
    """

    attempt: int
    failure: Failure | None
    alias: str
    wait: float
    error: BaseException | None
    sqlstate: str | None
    operation: str
    doing: str = ""


Hook = Callable[[RetryEvent], None]


@dataclass(frozen=True)
class RetryPolicy:
    """Which failures a ``locked_operation`` retries, and how.

    Each retry re-runs the whole decorated function in a fresh transaction, and only when the operation owns the
    outermost transaction on its alias. The wait is "full jitter" exponential backoff: a random time between 0 and
    ``min(wait_max, wait_initial * 2 ** (n - 1))`` seconds after the n-th failure. See
    https://www.postgresql.org/docs/current/mvcc-serialization-failure-handling.html.

    A lost connection (``Failure.CONNECTION_LOST``, listed by default) is retried on its own budget: it is retried
    only when the attempt provably did not commit (lockkit resolves a loss at COMMIT first and raises
    ``CommitOutcomeUnknown``, never retried, when it cannot), it does not count against ``attempts``, and it is
    retried for up to ``reconnect_within`` seconds from the first loss, waiting 0.05 s doubling to 0.5 s (half of
    each wait fixed, half random) in between: enough to ride out a fast server restart or failover.

    Args:
        attempts: Total attempts, the first included, not counting those that lost their connection (default 3).
        retry_on: The ``Failure`` kinds retried (default: deadlock, serialization failure, lock timeout and lost
            connection; a ``NOWAIT`` failure is a request to fail fast and is not retried unless listed).
            ``Failure.READ_ONLY`` and ``Failure.DATABASE_MISCONFIGURED`` are refused: a retry cannot mend them.
        wait_initial: Seconds, the backoff scale (default 0.005).
        wait_max: Seconds, the cap on one wait (default 0.2).
        deadline: Seconds, an overall bound: no attempt starts once it has passed (default ``None``: none).
        reconnect_within: Seconds a call keeps retrying lost connections, from the first loss (default 5).
        before_retry: Called with a ``RetryEvent`` before each wait.
        on_give_up: Called with a ``RetryEvent`` when a retryable failure is raised after the last attempt.

    Raises:
        TypeError: a value has the wrong type (``bool`` is not a count or a duration).
        ValueError: ``attempts`` < 1, a duration that is not positive and finite, ``wait_max < wait_initial``, a kind in
            ``retry_on`` that is never retried.
    """

    attempts: int = 3
    retry_on: Collection[Failure] = field(default=DEFAULT_RETRY_ON)
    wait_initial: Duration = 0.005
    wait_max: Duration = 0.2
    deadline: Duration | None = None
    before_retry: Hook | None = None
    on_give_up: Hook | None = None
    reconnect_within: Duration = 5.0

    def __post_init__(self) -> None:
        """Validate and normalise the fields (durations to seconds, ``retry_on`` to a frozenset).

        Raises:
            TypeError, ValueError: a field has the wrong type or value, named.
        """
        positive_int(self.attempts, "attempts")
        if isinstance(self.retry_on, str | bytes | Failure) or not isinstance(self.retry_on, Iterable):
            raise TypeError("retry_on must be an iterable of lockkit.Failure")
        retry_on = frozenset(self.retry_on)
        for item in retry_on:
            if not isinstance(item, Failure):
                raise TypeError(f"retry_on must hold lockkit.Failure members, not {type(item).__name__}")
        if Failure.READ_ONLY in retry_on:
            raise ValueError(
                "retry_on cannot include Failure.READ_ONLY: a read-only database never becomes writable"
            )
        if Failure.DATABASE_MISCONFIGURED in retry_on:
            raise ValueError(
                "retry_on cannot include Failure.DATABASE_MISCONFIGURED: the server refuses the same connection "
                "settings again"
            )
        object.__setattr__(self, "retry_on", retry_on)
        object.__setattr__(self, "wait_initial", duration(self.wait_initial, "wait_initial"))
        object.__setattr__(self, "wait_max", duration(self.wait_max, "wait_max"))
        object.__setattr__(self, "deadline", optional_duration(self.deadline, "deadline"))
        object.__setattr__(self, "reconnect_within", duration(self.reconnect_within, "reconnect_within"))
        if self._seconds("wait_max") < self._seconds("wait_initial"):
            raise ValueError(f"wait_max ({self.wait_max}) must be >= wait_initial ({self.wait_initial})")
        for name in ("before_retry", "on_give_up"):
            hook = getattr(self, name)
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable or None, not {type(hook).__name__}")

    def _seconds(self, name: str) -> float:
        value = getattr(self, name)
        assert isinstance(value, float)  # normalised by __post_init__
        return value

    def should_retry(self, exc: BaseException) -> bool:
        """Whether this policy retries ``exc`` (a classified lockkit error of a listed kind).

        ``CommitOutcomeUnknown`` never is: the work may have committed; nor is ``DatabaseMisconfigured``.
        """
        return _classified_as(exc, self._kinds())

    def _kinds(self) -> frozenset[Failure]:
        assert isinstance(self.retry_on, frozenset)  # normalised by __post_init__
        return self.retry_on

    def copy(self, **changes: Any) -> RetryPolicy:
        """Return a copy of this policy with ``changes`` (field names and values), validated like a new one.

        Like tenacity's ``Retrying.copy()``: ``policy.copy(retry_on={Failure.DEADLOCK_DETECTED})``.

        Raises:
            TypeError: an unknown field name, or a value of the wrong type.
            ValueError: a value ``RetryPolicy`` refuses.
        """
        return dataclasses.replace(self, **changes)

    def retrying(self, *, spent: float = 0.0) -> tenacity.Retrying:
        """Build a fresh ``tenacity.Retrying`` for one call (no hooks: ``build_retrying`` adds them).

        Composed of tenacity strategies: a ``retry_base`` predicate of the ``retry_on`` kinds (``should_retry``);
        the stop conditions "``attempts`` locking failures" | "``reconnect_within`` seconds of lost connections"
        (| ``stop_before_delay`` of the ``deadline``), a ``stop_any``; the waits "full jitter after a locking
        failure" + "equal jitter after a lost connection" (each is 0 after the other kind). The strategies that
        count (a lost connection does not count against ``attempts``) read one ``_Attempts`` record of the call.

        Args:
            spent: Seconds the call already spent before this ``Retrying`` starts its clock (its first attempt,
                when the ``Retrying`` is built only after that attempt failed); deducted from ``deadline``.
        """
        attempts = _Attempts()
        stop: tenacity.stop.stop_base = _StopAfterFailures(self.attempts, attempts) | _StopReconnectingAfter(
            self._seconds("reconnect_within"), attempts
        )
        if self.deadline is not None:
            stop = stop | tenacity.stop_before_delay(self._seconds("deadline") - spent)
        wait = _WaitFullJitter(self._seconds("wait_initial"), self._seconds("wait_max"), attempts) + (
            _WaitEqualJitter(RECONNECT_WAIT_INITIAL, RECONNECT_WAIT_MAX, attempts)
        )
        return tenacity.Retrying(
            stop=stop,
            wait=wait,
            retry=_RetryClassified(self._kinds()),
            reraise=True,
        )


def _classified_as(exc: BaseException | None, kinds: frozenset[Failure]) -> bool:
    """Whether ``exc`` is a classified lockkit error of one of ``kinds`` that may be retried.

    ``CommitOutcomeUnknown`` never may: the work may have committed. ``DatabaseMisconfigured`` never may: the
    server refuses the same settings again. A ``ReadOnlyDatabase`` may only when it is ``stale`` and lost
    connections are retried.
    """
    if isinstance(exc, CommitOutcomeUnknown | DatabaseMisconfigured):
        return False
    if isinstance(exc, ReadOnlyDatabase):
        # A kept connection on a node that became read-only (a failover) was discarded: a new one may reach the
        # writer. Retried with lost connections; a new connection that is read-only too is not (stale is False).
        return exc.stale and Failure.CONNECTION_LOST in kinds
    return isinstance(exc, LockError) and exc.failure is not None and exc.failure in kinds


class _RetryClassified(tenacity.retry_base):
    """Retry an attempt that raised a classified lockkit error of one of ``kinds`` (never a result)."""

    def __init__(self, kinds: frozenset[Failure]) -> None:
        self.kinds = kinds

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        """Whether the attempt ``retry_state`` reports failed with a retried kind."""
        outcome = retry_state.outcome
        return outcome is not None and outcome.failed and _classified_as(outcome.exception(), self.kinds)


class _MayRetry(tenacity.retry_base):
    """What a user's ``Retrying`` may retry at all: a result it asks to retry, or a classified lockkit error.

    Combined with the user's own predicate (``&``), so that tenacity's default (retry any ``Exception``) never
    retries what a retry could apply twice or cannot mend: ``CommitOutcomeUnknown`` (the work may have committed),
    ``DatabaseMisconfigured`` (the server refuses the same settings again), an error the attempt's own code raised
    (``change()``'s), a constraint violation, ``OnCommitError``.
    """

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        """Whether the attempt ``retry_state`` reports returned, or failed with a classified lockkit error."""
        outcome = retry_state.outcome
        return outcome is not None and (
            not outcome.failed or _classified_as(outcome.exception(), _EVERY_KIND)
        )


_EVERY_KIND = frozenset(Failure)


class _Attempts:
    """What one call's failed attempts were, as tenacity reports them: its strategies' shared record.

    Built per call, like the ``Retrying`` it serves. Every strategy that counts brings it up to date with the call
    state it is asked about (``seen``), so the record does not depend on which strategies tenacity asks (``|``
    stops at the first condition that holds) or in which order: each attempt is counted once.

    Attributes:
        failures: Failed attempts other than a lost connection.
        losses: Consecutive lost connections, up to the last attempt (0 when it failed otherwise).
        first_loss: Seconds from the ``Retrying``'s start to the call's first lost connection, or ``None``.
    """

    def __init__(self) -> None:
        self.failures = 0
        self.losses = 0
        self.first_loss: float | None = None
        self._counted = 0  # the attempt number last counted

    def seen(self, state: tenacity.RetryCallState) -> _Attempts:
        """Count the attempt ``state`` reports, once; return the record."""
        if state.attempt_number != self._counted:
            self._counted = state.attempt_number
            if self.lost(state):
                self.losses += 1
                if self.first_loss is None:
                    self.first_loss = state.seconds_since_start or 0.0
            else:
                self.losses = 0
                self.failures += 1
        return self

    @staticmethod
    def lost(state: tenacity.RetryCallState) -> bool:
        """Whether the attempt ``state`` reports lost its connection."""
        return state.outcome is not None and isinstance(state.outcome.exception(), ConnectionLost)


class _StopAfterFailures(tenacity.stop.stop_base):
    """Stop once ``attempts`` attempts have failed other than by losing their connection."""

    def __init__(self, attempts: int, record: _Attempts) -> None:
        self.attempts = attempts
        self.record = record

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        """Whether the call has made its last attempt."""
        return self.record.seen(retry_state).failures >= self.attempts


class _StopReconnectingAfter(tenacity.stop.stop_base):
    """Stop on a lost connection ``within`` seconds or more after the call's first one."""

    def __init__(self, within: float, record: _Attempts) -> None:
        self.within = within
        self.record = record

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        """Whether the last attempt lost its connection after the reconnect budget ran out."""
        record = self.record.seen(retry_state)
        if not record.losses:
            return False
        assert record.first_loss is not None  # set with the first loss
        return (retry_state.seconds_since_start or 0.0) - record.first_loss >= self.within


class _WaitFullJitter(tenacity.wait.wait_base):
    """After a locking failure: a random 0 to ``min(maximum, initial * 2 ** (n - 1))`` seconds (n-th failure).

    0 after a lost connection. "Full jitter": https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/
    """

    def __init__(self, initial: float, maximum: float, record: _Attempts) -> None:
        self.initial = initial
        self.maximum = maximum
        self.record = record

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        """Seconds to wait before the next attempt."""
        record = self.record.seen(retry_state)
        if record.losses:
            return 0.0
        cap = min(self.maximum, self.initial * 2.0 ** (record.failures - 1))
        return random.uniform(0, cap)  # jitter, not cryptography


class _WaitEqualJitter(tenacity.wait.wait_base):
    """After the n-th lost connection in a row: ``cap = min(maximum, initial * 2 ** (n - 1))``, half fixed, half random.

    "Equal jitter": never near zero, so that a restarting server has time to come back. 0 after any other failure.
    """

    def __init__(self, initial: float, maximum: float, record: _Attempts) -> None:
        self.initial = initial
        self.maximum = maximum
        self.record = record

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        """Seconds to wait before the next attempt."""
        record = self.record.seen(retry_state)
        if not record.losses:
            return 0.0
        cap = min(self.maximum, self.initial * 2.0 ** (record.losses - 1))
        return cap / 2 + random.uniform(0, cap / 2)  # jitter, not cryptography


RetrySetting = RetryPolicy | tenacity.Retrying | None


def check_retry(value: object, name: str = "retry") -> RetrySetting:
    """Return ``value`` as a retry setting (a dict becomes a ``RetryPolicy``).

    Raises:
        TypeError: ``value`` is not a ``RetryPolicy``, a tenacity ``Retrying``, a dict or ``None``.
    """
    if value is None or isinstance(value, RetryPolicy | tenacity.Retrying):
        return value
    if isinstance(value, dict):
        try:
            return RetryPolicy(**value)
        except TypeError as exc:
            raise TypeError(f"{name}: {exc}") from None
    raise TypeError(
        f"{name} must be a lockkit.RetryPolicy, a tenacity.Retrying or None, not {type(value).__name__}"
    )


#: The policy of a call that sets none in a project that sets no ``settings.LOCKKIT["RETRY"]``.
DEFAULT_POLICY = RetryPolicy()


def retrying_only(setting: RetrySetting, retry_on: Collection[Failure]) -> RetrySetting:
    """The same retry setting, retrying only the ``retry_on`` kinds: an entry point's own kinds on a project policy.

    A ``RetryPolicy`` is copied with ``retry_on`` (its attempts, waits, deadline, ``reconnect_within`` and hooks
    kept); a tenacity ``Retrying`` is copied with a retry predicate of those kinds (its stop and wait kept);
    ``None`` (no retries) stays ``None``.

    Raises:
        TypeError, ValueError: (a ``RetryPolicy``) ``retry_on`` is not a collection of ``Failure`` it may retry.
    """
    if setting is None:
        return None
    if isinstance(setting, RetryPolicy):
        return setting.copy(retry_on=retry_on)
    return setting.copy(retry=_RetryClassified(frozenset(retry_on)))


def _project_setting(value: object) -> RetrySetting:
    return check_retry(value, "LOCKKIT['RETRY']")


@functools.cache
def _project_setting_only(retry_on: frozenset[Failure]) -> Callable[[object], RetrySetting]:
    """The converter of ``settings.LOCKKIT["RETRY"]`` narrowed to ``retry_on``.

    One function per set of kinds, so that ``lockkit.conf`` keeps its result until the settings change.
    """

    def convert(value: object) -> RetrySetting:
        return retrying_only(_project_setting(value), retry_on)

    return convert


def from_settings(*, retry_on: Collection[Failure] | None = None) -> RetrySetting:
    """The project's retry setting, ``settings.LOCKKIT["RETRY"]`` (default ``RetryPolicy()``), read per call.

    Read through ``lockkit.conf``: validated once, kept until the settings change (``override_settings`` works).

    Args:
        retry_on: The kinds the caller retries instead of the setting's own (``retrying_only``); default: its own.

    Raises:
        lockkit.conf.SettingTypeError, lockkit.conf.SettingValueError: ``settings.LOCKKIT["RETRY"]`` is invalid.
    """
    convert = _project_setting if retry_on is None else _project_setting_only(frozenset(retry_on))
    return conf.resolved("RETRY", DEFAULT_POLICY, convert)


def setting_for(option: object) -> RetrySetting:
    """A call's retry setting: its own ``retry=`` (checked), or ``from_settings()`` for ``FROM_SETTINGS``.

    Raises:
        TypeError: ``option`` is not a ``RetryPolicy``, a tenacity ``Retrying``, a dict, ``None`` or the default.
        lockkit.conf.SettingTypeError, lockkit.conf.SettingValueError: ``settings.LOCKKIT["RETRY"]`` is invalid.
    """
    return from_settings() if isinstance(option, Default) else check_retry(option)


def reconnect_budget(setting: RetrySetting) -> float:
    """Seconds a call with ``setting`` works on a lost connection: reconnecting, resolving a lost reply.

    A ``RetryPolicy``'s ``reconnect_within``; the default policy's for a tenacity ``Retrying`` or ``None``.
    """
    policy = setting if isinstance(setting, RetryPolicy) else DEFAULT_POLICY
    return policy._seconds("reconnect_within")


def _event(state: tenacity.RetryCallState, alias: str, operation: str, doing: str, wait: float) -> RetryEvent:
    assert state.outcome is not None
    error = state.outcome.exception()  # None when a tenacity result predicate asked for the retry
    failure = error.failure if isinstance(error, LockError) else None
    sqlstate = error.sqlstate if isinstance(error, LockError) else (code_of(error) if error else None)
    return RetryEvent(state.attempt_number, failure, alias, wait, error, sqlstate, operation, doing)


def _extra(event: RetryEvent) -> dict[str, Any]:
    return {
        "alias": event.alias,
        "failure": event.failure.value if event.failure else None,
        "sqlstate": event.sqlstate,
        "attempt": event.attempt,
        "wait": event.wait,
        "operation": event.operation,
        "doing": event.doing,
    }


def call_with_retry(
    setting: RetryPolicy | tenacity.Retrying,
    attempt: Callable[[int], R],
    *,
    alias: str,
    operation: str,
    doing: str | None = None,
) -> R:
    """Call ``attempt(1)``, then ``attempt(2)``... while ``setting`` retries the failure; return the result.

    With a ``RetryPolicy`` the first attempt runs directly: its result is returned and an error the policy does not
    retry is raised as it is, exactly as tenacity would; only a retryable failure builds the call's ``Retrying``,
    which records that failure as its attempt 1 (hooks, logging, stop and the deadline, measured from the first
    attempt's start, all see it) and runs the next attempts. A tenacity ``Retrying`` may retry on results, so it
    drives every attempt of the call (through the call form, so result predicates and a
    ``retry_error_callback``'s return value work as tenacity documents them).

    Args:
        setting: The call's retry setting.
        attempt: Runs attempt ``n`` (1-based) and returns the call's result.
        alias: The database alias, for the hooks and the log lines.
        operation: The operation's name, for the hooks and signals (``RetryEvent.operation``).
        doing: What the call does, in the user's words, for the log lines ("claiming tasks"); default
            ``operation`` (the name of a function the user decorated is already theirs).

    Raises:
        Whatever the last attempt raised (after ``on_give_up`` ran, when retries are exhausted).
    """
    numbers = itertools.count(1)  # per call: the attempt number each try runs with
    if not isinstance(setting, RetryPolicy):
        retrying = build_retrying(setting, alias=alias, operation=operation, doing=doing)
        return retrying(lambda: attempt(next(numbers)))
    started = time.monotonic()
    try:
        return attempt(next(numbers))
    except BaseException as exc:
        if not setting.should_retry(exc):
            raise
        first: BaseException | None = exc
    retrying = build_retrying(
        setting, alias=alias, operation=operation, doing=doing, spent=time.monotonic() - started
    )

    def replayed_then_next() -> R:
        nonlocal first
        if first is not None:
            error, first = first, None
            raise error  # the first attempt's failure, as tenacity's attempt 1
        return attempt(next(numbers))

    return retrying(replayed_then_next)


def build_retrying(
    setting: RetryPolicy | tenacity.Retrying,
    *,
    alias: str,
    operation: str,
    doing: str | None = None,
    spent: float = 0.0,
) -> tenacity.Retrying:
    """Return a fresh ``Retrying`` for one call, logging each retry and give-up on the ``lockkit`` logger.

    The log lines say what the call was doing (``doing``, default ``operation``), never an internal function's
    name: ``lockkit: claiming tasks failed with connection_lost on 'default' (attempt 1); retrying in 0.050s``.

    A user-supplied ``Retrying`` is copied (never shared) with ``reraise=True``, so the last classified error is
    raised rather than tenacity's ``RetryError``; its own hooks still run after lockkit's. Its retry predicate is
    combined with lockkit's (``_MayRetry``): it never retries ``CommitOutcomeUnknown`` or an error lockkit did not
    classify, whatever it says.
    """
    if isinstance(setting, RetryPolicy):
        base = setting.retrying(spent=spent)
        user_before_sleep: Callable[[tenacity.RetryCallState], None] | None = None
        user_error_callback: Callable[[tenacity.RetryCallState], Any] | None = None
        before_retry, on_give_up = setting.before_retry, setting.on_give_up
    else:
        base = setting.copy(retry=setting.retry & _MayRetry())
        user_before_sleep, user_error_callback = setting.before_sleep, setting.retry_error_callback
        before_retry = on_give_up = None

    described = doing or operation

    def before_sleep(state: tenacity.RetryCallState) -> None:
        wait = state.upcoming_sleep
        event = _event(state, alias, operation, described, 0.0 if math.isnan(wait) else float(wait))
        logger.info(
            "lockkit: %s failed with %s on %r (attempt %d); retrying in %.3fs",
            described,
            event.failure.value if event.failure else type(event.error).__name__,
            alias,
            event.attempt,
            event.wait,
            extra=_extra(event),
        )
        events.retried(event)
        if before_retry is not None:
            before_retry(event)
        if user_before_sleep is not None:
            user_before_sleep(state)

    def give_up(state: tenacity.RetryCallState) -> Any:
        event = _event(state, alias, operation, described, 0.0)
        if isinstance(event.error, LockError):
            event.error.attempts = state.attempt_number
        logger.warning(
            "lockkit: %s gave up after %d attempt(s) on %r: %s",
            described,
            event.attempt,
            alias,
            event.failure.value if event.failure else type(event.error).__name__,
            extra=_extra(event),
        )
        events.gave_up(event)
        if on_give_up is not None:
            on_give_up(event)
        if user_error_callback is not None:
            return user_error_callback(state)
        assert state.outcome is not None
        return state.outcome.result()  # re-raises the last attempt's error (or returns its result)

    return base.copy(before_sleep=before_sleep, retry_error_callback=give_up, reraise=True)
