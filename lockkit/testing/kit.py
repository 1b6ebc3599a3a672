"""``ContentionKit``: the toolkit's helpers bound to one test, cleaning up after it (the pytest fixture).

It remembers the threads a test started and, at teardown, fails the test if one is still running (after
cancelling its database wait), so a forgotten contender cannot leak into the next test or block the test
database's teardown.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from lockkit.testing.aliases import AliasLog, assert_single_alias
from lockkit.testing.blocking import blocked_by, wait_until_blocked
from lockkit.testing.errors import ContentionTimeout
from lockkit.testing.holding import Holder, hold_lock
from lockkit.testing.sessions import backend_pid
from lockkit.testing.threads import Outcome, ThreadCall, in_thread, run_concurrently
from lockkit.validation import duration

T = TypeVar("T")


class ContentionKit:
    """The contention helpers for one test, with shared default timeouts and cleanup of started threads.

    Each method is the ``lockkit.testing`` function of the same name; ``timeout`` defaults to the kit's.

    Attributes:
        timeout (float): Default seconds for waits and joins.
    """

    def __init__(self, timeout: float = 10.0) -> None:
        self.timeout = duration(timeout, "timeout")
        self._calls: list[ThreadCall[Any]] = []

    def hold_lock(self, target: object, **options: Any) -> AbstractContextManager[Holder]:
        """``lockkit.testing.hold_lock`` (default ``timeout``: the kit's)."""
        options.setdefault("timeout", self.timeout)
        return hold_lock(target, **options)

    def wait_until_blocked(self, holder: Holder | int, **options: Any) -> list[int]:
        """``lockkit.testing.wait_until_blocked`` (default ``timeout``: the kit's)."""
        options.setdefault("timeout", self.timeout)
        return wait_until_blocked(holder, **options)

    def blocked_by(self, holder: Holder | int, *, using: str | None = None) -> list[int]:
        """``lockkit.testing.blocked_by``."""
        return blocked_by(holder, using=using)

    def in_thread(self, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> ThreadCall[T]:
        """``lockkit.testing.in_thread``; the thread is checked at teardown."""
        call = in_thread(func, *args, **kwargs)
        self._calls.append(call)
        return call

    def run_concurrently(self, func: Callable[..., T], n: int, **options: Any) -> list[Outcome[T]]:
        """``lockkit.testing.run_concurrently`` (default ``timeout``: the kit's)."""
        options.setdefault("timeout", self.timeout)
        return run_concurrently(func, n, **options)

    def assert_single_alias(self, alias: str) -> AbstractContextManager[AliasLog]:
        """``lockkit.testing.assert_single_alias``."""
        return assert_single_alias(alias)

    def backend_pid(self, using: str = "default") -> int:
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
