"""Running callers in threads that start together, each on its own connections, joined with a timeout.

A caller's result or exception is kept as an ``Outcome`` for the test's thread to assert on (or re-raise), so
an assertion failing inside a thread fails the test instead of vanishing with the thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar

from django.core.exceptions import ObjectDoesNotExist
from django.db import connections

from lockkit.testing.failures import ContentionTimeout, invisible_rows
from lockkit.testing.sessions import SessionTracker
from lockkit.validation import Duration, duration

T = TypeVar("T")
P = ParamSpec("P")

# After cancelling a stuck caller's statement, how long to let it unwind and close its connection.
_UNWIND_SECONDS = 2.0


@dataclass
class Outcome(Generic[T]):
    """What one caller did: its index, and its return value or the exception it raised.

    Attributes:
        index: The caller's position (0 to ``n - 1`` for ``run_concurrently``).
        result: The return value, or ``None`` if it raised.
        error: The exception it raised, or ``None``.
    """

    index: int
    result: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """Whether the caller returned without raising."""
        return self.error is None

    def unwrap(self) -> T:
        """Return the result, or raise the caller's exception."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]  # T itself may be None


def _limit(value: object, name: str) -> float:
    return duration(value, name)


def _explained(outcome: Outcome[T], caller: str) -> Outcome[T]:
    """Note on a caller's ``DoesNotExist`` why it may not see the row: the test's thread has not committed it.

    Called in the test's thread, whose connections hold the uncommitted rows (a ``TestCase``); ``hold_lock``'s
    ``NothingLocked`` gives the same explanation. Added once per exception.
    """
    error = outcome.error
    if not isinstance(error, ObjectDoesNotExist):
        return outcome
    open_on = sorted(c.alias for c in connections.all(initialized_only=True) if c.in_atomic_block)
    if open_on and not any(note.startswith(caller) for note in getattr(error, "__notes__", ())):
        error.add_note(
            invisible_rows(
                f"{caller} did not find the row in its own session, while the test's thread is inside an "
                f"uncommitted transaction on {', '.join(map(repr, open_on))}."
            )
        )
    return outcome


class ThreadCall(Generic[T]):
    """One callable running in its own thread, with its own database connections (see ``in_thread``).

    The thread closes every connection it opened when the callable ends. Ask for the outcome with a timeout.
    """

    def __init__(
        self,
        func: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        index: int = 0,
        barrier: threading.Barrier | None = None,
        barrier_timeout: float | None = None,
    ) -> None:
        """Prepare the call; ``start()`` runs it on its own thread."""
        self.name = f"lockkit-call-{index}-{getattr(func, '__name__', 'callable')}"
        self._outcome: Outcome[T] = Outcome(index)
        self._sessions = SessionTracker()
        self._func, self._args, self._kwargs = func, args, kwargs
        self._barrier, self._barrier_timeout = barrier, barrier_timeout
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> ThreadCall[T]:
        """Start the thread (it may wait at the barrier first); return this call."""
        self._thread.start()
        return self

    def _run(self) -> None:
        # Record the sessions this thread opens, so that another thread can cancel a statement stuck in them.
        self._sessions.start()
        try:
            if self._barrier is not None:
                self._barrier.wait(self._barrier_timeout)
            self._outcome.result = self._func(*self._args, **self._kwargs)
        except BaseException as exc:
            self._outcome.error = exc
        finally:
            connections.close_all()
            self._sessions.stop()

    def done(self) -> bool:
        """Whether the callable has finished (returned or raised)."""
        return self._thread.ident is not None and not self._thread.is_alive()

    def join(self, timeout: Duration) -> bool:
        """Wait up to ``timeout`` seconds (or a ``timedelta``; 0 polls); return whether the callable finished."""
        self._thread.join(timeout.total_seconds() if isinstance(timeout, timedelta) else timeout)
        return not self._thread.is_alive()

    def cancel_statements(self) -> list[int]:
        """Cancel the database statements this thread is running (a stuck lock wait); return the sessions."""
        return self._sessions.cancel_statements()

    def outcome(self, timeout: Duration = 10.0) -> Outcome[T]:
        """Wait for the callable and return its ``Outcome``.

        Args:
            timeout: Seconds to wait.

        Raises:
            ContentionTimeout: it was still running after ``timeout``; its database statement is cancelled so
                that its connection does not outlive the test.
            TypeError, ValueError: ``timeout`` is not a positive number of seconds.
        """
        limit = _limit(timeout, "timeout")
        if not self.join(limit):
            self.cancel_statements()
            self.join(_UNWIND_SECONDS)
            raise ContentionTimeout(f"{self.name} was still running after {limit}s")
        return _explained(self._outcome, self.name)

    def result(self, timeout: Duration = 10.0) -> T:
        """Wait for the callable and return its result, or raise its exception.

        Raises:
            ContentionTimeout: as ``outcome()``.
            Exception: whatever the callable raised, raised again here.
        """
        return self.outcome(timeout).unwrap()


def in_thread(func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> ThreadCall[T]:
    """Start ``func(*args, **kwargs)`` in a new thread (its own database sessions) and return at once.

    Use it for a contender that must be waiting while the test's thread does something else: start it, wait
    until the database shows it blocked (``wait_until_blocked``), release the lock, then read
    ``.result(timeout)``.

    Returns:
        The running ``ThreadCall``.

    Raises:
        TypeError: ``func`` is not callable.
    """
    if not callable(func):
        raise TypeError(f"func must be callable, not {type(func).__name__}")
    return ThreadCall(func, args, kwargs).start()


def _per_caller_args(args: object, n: int) -> list[tuple[Any, ...]]:
    if isinstance(args, tuple):
        return [args] * n
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise TypeError(f"args must be a tuple (shared) or a list of n tuples, not {type(args).__name__}")
    if len(args) != n:
        raise ValueError(f"args must hold n={n} tuples, one per caller, got {len(args)}")
    for i, item in enumerate(args):
        if not isinstance(item, tuple):
            raise TypeError(f"args[{i}] must be a tuple of arguments, not {type(item).__name__}")
    return list(args)


def run_concurrently(
    func: Callable[..., T],
    n: int,
    *,
    args: Sequence[tuple[Any, ...]] | tuple[Any, ...] = (),
    timeout: Duration = 30.0,
    reraise: bool = False,
) -> list[Outcome[T]]:
    """Run ``func`` in ``n`` threads that start together at a barrier, and join them all within ``timeout``.

    Each caller runs on its own database connections (Django's are per thread) and closes them when it ends. A
    caller still running at the deadline has its database statement cancelled (``pg_cancel_backend()``,
    ``KILL QUERY``), so a stuck test fails fast and leaves no session behind; see
    https://docs.djangoproject.com/en/stable/topics/testing/tools/#transactiontestcase.

    Args:
        func: The callable each caller runs.
        n: How many callers (a positive ``int``).
        args: A tuple of arguments given to every caller, or a list of ``n`` tuples, one per caller.
        timeout: Seconds for every caller to pass the barrier and finish, counted from the start.
        reraise: Raise the first failed caller's exception (by index) instead of returning the outcomes; the
            other failures are attached to it as notes.

    Returns:
        One ``Outcome`` per caller, in index order.

    Raises:
        ContentionTimeout: a caller had not finished within ``timeout``.
        TypeError: ``func`` is not callable, ``n`` is not an ``int``, ``args`` is neither a tuple nor a list
            of tuples, ``timeout`` is not seconds.
        ValueError: ``n`` is below 1, ``args`` does not hold ``n`` tuples, ``timeout`` is not positive.
        Exception: with ``reraise``, the first exception a caller raised.
    """
    if not callable(func):
        raise TypeError(f"func must be callable, not {type(func).__name__}")
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, not {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    limit = _limit(timeout, "timeout")
    if not isinstance(reraise, bool):
        raise TypeError(f"reraise must be True or False, not {type(reraise).__name__}")
    per_call = _per_caller_args(args, n)
    barrier = threading.Barrier(n)
    calls = [
        ThreadCall(func, per_call[i], {}, index=i, barrier=barrier, barrier_timeout=limit) for i in range(n)
    ]
    deadline = time.monotonic() + limit
    for call in calls:
        call.start()
    for call in calls:
        call.join(max(0.0, deadline - time.monotonic()))
    stuck = [call for call in calls if not call.done()]
    if stuck:
        for call in stuck:
            call.cancel_statements()
        for call in stuck:
            call.join(_UNWIND_SECONDS)
        names = ", ".join(call.name for call in stuck)
        raise ContentionTimeout(
            f"run_concurrently: {len(stuck)} of {n} caller(s) still running after {limit}s: {names}"
        )
    outcomes = [
        _explained(call._outcome, f"run_concurrently: caller {call._outcome.index}") for call in calls
    ]
    if reraise:
        failed = [outcome for outcome in outcomes if outcome.error is not None]
        if failed:
            first = failed[0].error
            assert first is not None
            for other in failed[1:]:
                first.add_note(f"caller {other.index} also raised {other.error!r}")
            raise first
    return outcomes


__all__ = ["Outcome", "ThreadCall", "in_thread", "run_concurrently"]
