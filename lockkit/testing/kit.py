"""``ContentionKit``: the toolkit's helpers bound to one test, cleaning up after it (the pytest fixture).

It remembers the threads a test started and, at teardown, fails the test if one is still running (after
cancelling its database wait), so a forgotten contender cannot leak into the next test or block the test
database's teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS

from lockkit.testing.blocking import blocked_by, wait_until_blocked
from lockkit.testing.failures import ContentionTimeout
from lockkit.testing.holding import Holder, hold_lock
from lockkit.testing.monitor import LockWaitMonitor
from lockkit.testing.querylog import AliasLog, assert_single_alias
from lockkit.testing.sessions import backend_pid
from lockkit.testing.threads import Outcome, ThreadCall, in_thread, run_concurrently
from lockkit.validation import Duration, duration

T = TypeVar("T")
P = ParamSpec("P")


class ContentionKit:
    """The contention helpers for one test, with shared default timeouts and cleanup of started threads.

    Each method is the ``lockkit.testing`` function of the same name; ``timeout=None`` means the kit's.

    Args:
        timeout: Default seconds for waits and joins (positive).

    Attributes:
        timeout (float): Default seconds for waits and joins.

    Raises:
        TypeError, ValueError: ``timeout`` is not a positive number of seconds.
    """

    def __init__(self, timeout: Duration = 10.0) -> None:
        """Bind the helpers to one test, each wait bounded by ``timeout`` seconds (or a ``timedelta``)."""
        self.timeout = duration(timeout, "timeout")
        self._calls: list[ThreadCall[Any]] = []

    def _or_default(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    def hold_lock(
        self,
        target: object,
        *,
        using: str | None = None,
        nowait: bool = False,
        no_key: bool = False,
        timeout: float | None = None,
    ) -> AbstractContextManager[Holder]:
        """``lockkit.testing.hold_lock`` (default ``timeout``: the kit's)."""
        return hold_lock(target, using=using, nowait=nowait, no_key=no_key, timeout=self._or_default(timeout))

    def wait_until_blocked(
        self,
        holder: Holder | int,
        *,
        count: int = 1,
        using: str | None = None,
        timeout: float | None = None,
        poll: float = 0.005,
        contenders: ThreadCall[Any] | Sequence[ThreadCall[Any]] = (),
    ) -> list[int]:
        """``lockkit.testing.wait_until_blocked`` (default ``timeout``: the kit's)."""
        return wait_until_blocked(
            holder,
            count=count,
            using=using,
            timeout=self._or_default(timeout),
            poll=poll,
            contenders=contenders,
        )

    def blocked_by(self, holder: Holder | int, *, using: str | None = None) -> list[int]:
        """``lockkit.testing.blocked_by``."""
        return blocked_by(holder, using=using)

    def in_thread(self, func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> ThreadCall[T]:
        """``lockkit.testing.in_thread``; the thread is checked at teardown."""
        call = in_thread(func, *args, **kwargs)
        self._calls.append(call)
        return call

    def run_concurrently(
        self,
        func: Callable[..., T],
        n: int,
        *,
        args: Sequence[tuple[Any, ...]] | tuple[Any, ...] = (),
        timeout: float | None = None,
        reraise: bool = False,
    ) -> list[Outcome[T]]:
        """``lockkit.testing.run_concurrently`` (default ``timeout``: the kit's)."""
        return run_concurrently(func, n, args=args, timeout=self._or_default(timeout), reraise=reraise)

    def monitor(self, using: str = DEFAULT_DB_ALIAS, *, interval: float = 0.01) -> LockWaitMonitor:
        """A ``lockkit.testing.LockWaitMonitor`` on ``using``, not started (use it in a ``with`` block)."""
        return LockWaitMonitor(using, interval)

    def assert_single_alias(self, alias: str) -> AbstractContextManager[AliasLog]:
        """``lockkit.testing.assert_single_alias``."""
        return assert_single_alias(alias)

    def backend_pid(self, using: str = DEFAULT_DB_ALIAS) -> int:
        """``lockkit.testing.backend_pid``."""
        return backend_pid(using)

    def close(self) -> None:
        """Wait for the threads started with ``in_thread``; fail if one is still running after the timeout.

        Raises:
            ContentionTimeout: a thread was still running; its database statement has been cancelled.
        """
        stuck = [call for call in self._calls if not call.join(self.timeout)]
        self._calls.clear()
        for call in stuck:
            call.cancel_statements()
        if stuck:
            names = ", ".join(call.name for call in stuck)
            raise ContentionTimeout(
                f"thread(s) still running at the end of the test after {self.timeout}s: {names}"
            )


__all__ = ["ContentionKit"]
