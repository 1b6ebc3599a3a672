"""``locked_operation``: a decorator running each call in a locked scope, retried as a whole in a fresh one.

An attempt runs in a ``ScopeBlock``; retries come from tenacity (``lockkit.retries``) and happen only when the call
owns the outermost transaction on its alias. An error raised after an attempt committed is carried past the retry
loop by ``_Committed`` so that committed work is never re-run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, Protocol, TypeVar, cast, overload

import tenacity
from django.db import connections, models

from lockkit import events
from lockkit._engine.transaction import in_transaction
from lockkit.aio import awaitable
from lockkit.errors import LockError, OnCommitError, TransientLockError
from lockkit.operations.naming import operation_name
from lockkit.retries import (
    RetryPolicy,
    RetrySetting,
    call_with_retry,
    check_retry,
    from_settings,
    logger,
)
from lockkit.scopes.blocks import ScopeBlock, refuse_unsupported
from lockkit.scopes.options import FROM_SETTINGS, NOT_GIVEN, Default, Duration, ScopeOptions
from lockkit.scopes.stack import active_blocks

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class _Committed(BaseException):
    """Carries an error past the retry loop: the attempt committed, or work committed on another alias during it.

    The first case is an ``on_commit`` callback failing after the COMMIT.

    A ``BaseException`` so that no retry predicate (``retry_if_exception_type()`` matches ``Exception``) retries
    work that is already committed.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


# The value of an attempt that has not returned yet (``None`` is a real result).
_NO_RESULT: Any = object()


def _would_retry(retry: RetryPolicy | tenacity.Retrying, exc: LockError) -> bool:
    """Whether ``retry`` would have retried ``exc`` had the call owned its transaction.

    For a tenacity ``Retrying``: any transient error (its predicate cannot be asked without its call state).
    """
    if isinstance(retry, RetryPolicy):
        return retry.should_retry(exc)
    return isinstance(exc, TransientLockError)


def _outer_block(alias: str) -> str:
    """Describe the transaction a nested call ran in, for the note on its error."""
    connection = connections[alias]
    if any(block.scope.alias == alias for block in active_blocks()):
        return f"an enclosing lockkit scope on {alias!r}"
    if not connection.in_atomic_block:
        return f"a transaction on {alias!r} begun by transaction.set_autocommit(False)"
    if connection.settings_dict.get("ATOMIC_REQUESTS"):
        return (
            f"transaction.atomic() on {alias!r}; ATOMIC_REQUESTS is on for {alias!r}, so a view runs inside one: "
            "decorate the view with django.db.transaction.non_atomic_requests"
        )
    return f"transaction.atomic() on {alias!r}"


def _explain_nested(exc: LockError, alias: str, operation: str) -> None:
    """Say on the error, and in a log record, that it was not retried because the call was nested."""
    outer = _outer_block(alias)
    exc.add_note(
        f"lockkit: not retried: {operation} ran inside {outer}. A retry there would run in a transaction the "
        "failure has already spoilt, so lockkit makes one attempt and leaves the decision to the owner of the "
        "transaction; retries happen when the operation owns the outermost transaction on its alias (call it "
        "outside that block)"
    )
    logger.info(
        "lockkit: %s failed with %s on %r and was not retried: it ran inside %s",
        operation,
        exc.failure.value if exc.failure else type(exc).__name__,
        alias,
        outer,
        extra={
            "alias": alias,
            "failure": exc.failure.value if exc.failure else None,
            "sqlstate": exc.sqlstate,
            "attempt": 1,
            "operation": operation,
            "nested": True,
        },
    )


def _log_committed_elsewhere(
    exc: BaseException, others: tuple[str, ...], alias: str, number: int, operation: str
) -> None:
    """Log that a failed attempt is not retried because work committed on ``others`` during it."""
    failure = exc.failure.value if isinstance(exc, LockError) and exc.failure else type(exc).__name__
    logger.info(
        "lockkit: %s failed with %s on %r (attempt %d) and is not retried: work committed on %s during it",
        operation,
        failure,
        alias,
        number,
        ", ".join(repr(other) for other in others),
        extra={
            "alias": alias,
            "failure": failure,
            "attempt": number,
            "operation": operation,
            "committed_elsewhere": others,
        },
    )


class LockedFunction(Protocol[P, R_co]):
    """What ``locked_operation`` returns: the function itself, plus ``acall`` for async callers."""

    __name__: str
    __qualname__: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co:
        """Run the operation (retried as a whole) and return what the function returns."""
        ...

    def acall(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R_co]:
        """Awaitable form: run the whole call (retries, scope, ``on_commit`` callbacks) on one thread.

        Through ``asgiref.sync.sync_to_async(thread_sensitive=True)``, like Django's ``aget()``/``asave()``: see
        ``lockkit.aio.awaitable``.
        """
        ...


def _policy(option: RetrySetting | Default) -> RetrySetting:
    """The operation's retry setting: its own, else ``settings.LOCKKIT["RETRY"]`` (cached), else the default."""
    return from_settings() if isinstance(option, Default) else option


def _unwrap(error: BaseException) -> BaseException:
    return error.error if isinstance(error, _Committed) else error


class LockedOperation:
    """The decorator ``locked_operation(...)`` returns; configuration only, no per-call state."""

    def __init__(
        self, options: ScopeOptions, retry: RetrySetting | Default, *, doing: str | None = None
    ) -> None:
        """Hold the validated options and the retry setting (``Default.FROM_SETTINGS``: read it per call).

        ``doing`` says what the operation does in words, for the retry log lines (lockkit's own operations, whose
        functions are internal); default the decorated function's name.
        """
        self._options = options
        self._retry = retry
        self._doing = doing

    def __call__(self, func: Callable[P, R]) -> LockedFunction[P, R]:
        """Decorate ``func``; the result also has ``acall()``, its awaitable form.

        Raises:
            TypeError: ``func`` is not a plain synchronous function (an ``async def`` is refused: decorate the
                synchronous body and await ``.acall()``).
        """
        refuse_unsupported(func, "locked_operation")
        options, retry_option, doing = self._options, self._retry, self._doing
        operation = operation_name(func)

        def attempt(alias: str, number: int, args: Any, kwargs: Any) -> R:
            # A COMMIT whose reply was lost is resolved for as long as the policy rides out a lost connection.
            policy = _policy(retry_option)
            # (RetryPolicy normalises its durations to float seconds.)
            within = cast(float, policy.reconnect_within) if isinstance(policy, RetryPolicy) else None
            block = ScopeBlock(options, alias, number, owner=self, resolve_within=within)
            result: Any = _NO_RESULT
            try:
                with block:
                    result = func(*args, **kwargs)
                return result  # type: ignore[no-any-return]
            except BaseException as exc:
                if isinstance(exc, OnCommitError) and result is not _NO_RESULT:
                    exc.result = result
                if block.committed:
                    raise _Committed(exc) from exc  # a callback failed after the COMMIT: never run it again
                if block.scope.committed_elsewhere:
                    # Work committed on another alias during the attempt: running it again would repeat that work.
                    _log_committed_elsewhere(exc, block.scope.committed_elsewhere, alias, number, operation)
                    raise _Committed(exc) from exc
                raise

        def run(
            alias: str, args: Any, kwargs: Any, attempt: Callable[[str, int, Any, Any], R] = attempt
        ) -> R:
            retry = _policy(retry_option)
            try:
                if retry is None:
                    return attempt(alias, 1, args, kwargs)
                if in_transaction(connections[alias]):
                    # Nested in an outer transaction (ATOMIC_REQUESTS included): a retry here would run inside
                    # the failed transaction, so make one attempt and let the owner of the transaction decide.
                    try:
                        return attempt(alias, 1, args, kwargs)
                    except LockError as exc:
                        if _would_retry(retry, exc):
                            _explain_nested(exc, alias, operation)
                        raise
                # A RetryPolicy builds tenacity's Retrying only after a first retryable failure.
                return call_with_retry(
                    retry,
                    lambda number: attempt(alias, number, args, kwargs),
                    alias=alias,
                    operation=operation,
                    doing=doing,
                )
            except _Committed as committed:
                # Keep the error's own cause (an OnCommitError's callback failure); hide the carrier.
                raise committed.error from committed.error.__cause__

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            alias = options.alias_for_call(args, kwargs)
            if not events.observing():
                return run(alias, args, kwargs)
            with events.ObservedOperation(wrapper, operation, alias, _unwrap) as observed:
                return run(alias, args, kwargs, observed.wrap(attempt))

        wrapper.acall = awaitable(wrapper)  # type: ignore[attr-defined]
        return cast(LockedFunction[P, R], wrapper)


@overload
def locked_operation(
    func: Callable[P, R],
    /,
    *,
    model: type[models.Model] | None = None,
    retry: RetrySetting = FROM_SETTINGS,
    lock_timeout: Duration | None = FROM_SETTINGS,
    statement_timeout: Duration | None = FROM_SETTINGS,
    nowait: bool = False,
    skip_locked: bool = False,
    no_key: bool = False,
) -> LockedFunction[P, R]: ...
@overload
def locked_operation(
    using_or_func: str | None = None,
    /,
    *,
    using: str | Callable[..., str] | None = None,
    model: type[models.Model] | None = None,
    retry: RetrySetting = FROM_SETTINGS,
    lock_timeout: Duration | None = FROM_SETTINGS,
    statement_timeout: Duration | None = FROM_SETTINGS,
    nowait: bool = False,
    skip_locked: bool = False,
    no_key: bool = False,
) -> Callable[[Callable[P, R]], LockedFunction[P, R]]: ...
def locked_operation(
    using_or_func: Any = NOT_GIVEN,
    /,
    *,
    using: Any = NOT_GIVEN,
    model: type[models.Model] | None = None,
    retry: Any = FROM_SETTINGS,
    lock_timeout: Duration | None = FROM_SETTINGS,
    statement_timeout: Duration | None = FROM_SETTINGS,
    nowait: bool = False,
    skip_locked: bool = False,
    no_key: bool = False,
) -> Any:
    """Decorate a function so each call runs in a locked scope, retried as a whole on transient failures.

    Each call resolves one alias (``using``, a callable of the call's arguments, ``router.db_for_write(model)``
    or ``"default"``) and runs the function inside ``locked(alias, ...)``; inside it, ``lockkit.current_scope()``
    and ``lockkit.lock()`` reach the scope. When the call owns the outermost transaction on that alias, a failure
    the retry policy lists rolls the transaction back and re-runs the whole function in a fresh one; nested in an
    outer ``atomic()`` (``ATOMIC_REQUESTS`` included) it makes exactly one attempt and raises the classified error,
    leaving the outer transaction usable. See
    https://www.postgresql.org/docs/current/mvcc-serialization-failure-handling.html.

    Args:
        using: An alias, ``None``, or (keyword ``using=`` only) a callable receiving the decorated function's
            arguments and returning the alias. A positional callable is always the function to decorate, as with
            Django's ``atomic``: ``@locked_operation`` written bare, or ``locked_operation(func, nowait=True)``.
        model: The model whose ``router.db_for_write`` gives the alias when ``using`` is ``None``.
        retry: A ``RetryPolicy``, a tenacity ``Retrying`` (copied per call, with ``reraise=True``) or ``None`` for
            no retries. Default ``settings.LOCKKIT["RETRY"]``, itself ``RetryPolicy()``.
        using_or_func: The function to decorate, or an alias (``None`` included) given positionally.
        lock_timeout: As for ``locked()``.
        statement_timeout: As for ``locked()``.
        nowait: As for ``locked()``.
        skip_locked: As for ``locked()``.
        no_key: As for ``locked()``.

    Returns:
        A decorator; the decorated function returns what the function returns, and its ``acall(*args,
        **kwargs)`` is the awaitable form for async code (``await reserve_stock.acall("sku", 1)``): the whole
        call, retries and ``on_commit`` callbacks included, runs on one thread through
        ``asgiref.sync.sync_to_async(thread_sensitive=True)``.

    Raises:
        TypeError: at decoration, a wrong parameter type or an ``async def`` function; at call, ``using`` returned
            something that is not a string.
        ValueError: at decoration, a bad value (see ``locked()``); at call, ``using`` returned an unknown alias.
        LockError: the last attempt's database failure as its typed subclass, with ``.attempts`` set.
            ``LockTimeout``, ``DeadlockDetected`` and ``SerializationFailure`` are retried first by the default
            policy; ``LockNotAvailable``, ``StatementTimeout`` and ``ReadOnlyDatabase`` are not (but a ``stale``
            ``ReadOnlyDatabase`` is, once, on a new connection, with lost connections). See
            ``locked()`` for when each is raised.
    """
    if using_or_func is not NOT_GIVEN and using is not NOT_GIVEN:
        raise TypeError("locked_operation() got using both positionally and as a keyword")
    func = (
        using_or_func if callable(using_or_func) else None
    )  # Django's rule: a positional callable is decorated
    if using is NOT_GIVEN:
        using = None if func is not None or using_or_func is NOT_GIVEN else using_or_func
    options = ScopeOptions.build(
        using,
        model=model,
        lock_timeout=lock_timeout,
        statement_timeout=statement_timeout,
        nowait=nowait,
        skip_locked=skip_locked,
        no_key=no_key,
        allow_callable=True,
    )
    checked_retry = retry if retry is FROM_SETTINGS else check_retry(retry)
    decorator = LockedOperation(options, checked_retry)
    return decorator if func is None else decorator(func)


__all__ = ["LockedFunction", "LockedOperation", "locked_operation"]
