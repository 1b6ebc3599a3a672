"""The cancellation an awaiting caller shares with the thread that runs its call (``lockkit.aio``).

An async caller runs a lockkit call on a thread (``sync_to_async``); when the caller is cancelled (a client
disconnect, ``asyncio.timeout``), the thread does not stop by itself and would go on to commit. The awaitable
form activates a ``Cancellation`` for the call (a context variable, copied into the thread with the call's
context); the scope the thread runs consults it:

- an outermost scope ``attach``es how to cancel its session's statement in flight on the server;
- before sending COMMIT (a scope's, or a claims call's one message) it calls ``begin_commit()``: once that has
  returned ``True`` a cancel can no longer stop the commit, and the caller is told the commit's outcome instead;
- ``cancel()`` (the caller's side) marks the call cancelled, so that no new attempt and no COMMIT start; unless a
  COMMIT was already sent, it also cancels the statement in flight on a thread of its own, and the scope rolls
  back and raises ``CallCancelled`` in the thread.

See https://docs.python.org/3/library/asyncio-task.html#task-cancellation.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator

logger = logging.getLogger("lockkit")

# How long a scope that saw the cancellation waits for the server-side cancel it triggered to be sent, so that a
# late cancel never reaches a later statement of the same session.
SETTLE_TIMEOUT = 5.0


class CallCancelled(BaseException):
    """Raised in the thread of a call whose awaiting caller was cancelled, before COMMIT: nothing committed.

    A ``BaseException``, like ``asyncio.CancelledError``: a body's ``except Exception`` does not swallow it, Django's
    ``atomic()`` rolls back on it, and no retry policy retries it. The awaiting caller itself gets its
    ``asyncio.CancelledError``.
    """


class Cancellation:
    """One awaitable call's cancellation state, shared by the awaiting task and the thread running the call."""

    def __init__(self) -> None:
        """A call not cancelled, not committing, with no statement to cancel yet."""
        self._lock = threading.Lock()
        self.cancelled = False
        self.committing = False
        self._cancel_statement: Callable[[], None] | None = None
        self._canceller: threading.Thread | None = None
        # Seconds the call may spend resolving a COMMIT whose reply was lost (its policy's reconnect_within),
        # told by begin_commit(); None: lockkit's default.
        self.resolve_within: float | None = None

    def attach(self, cancel_statement: Callable[[], None] | None) -> None:
        """Record how to cancel the statement the call's session runs (``None``: the vendor cannot)."""
        with self._lock:
            self._cancel_statement = cancel_statement

    def raise_if_cancelled(self) -> None:
        """Raise ``CallCancelled`` when the caller was cancelled (before a new attempt or statement)."""
        if self.cancelled:
            raise CallCancelled("the awaiting caller was cancelled")

    def begin_commit(self, resolve_within: float | None = None) -> bool:
        """Claim the right to send COMMIT: ``False`` when the caller was cancelled first (roll back instead).

        Args:
            resolve_within: Seconds the call may then spend resolving a lost reply (its retry policy's
                ``reconnect_within``), so that a caller cancelled meanwhile waits that long for the outcome;
                ``None`` for lockkit's default.
        """
        with self._lock:
            if self.cancelled:
                return False
            self.committing = True
            if resolve_within is not None:
                self.resolve_within = resolve_within
            return True

    def cancel(self) -> bool:
        """Cancel the call from the awaiting side; ``False`` when a COMMIT was already sent (wait for its outcome).

        Either way no new attempt or COMMIT starts after this. When ``True``, nothing of the call will commit: the
        thread rolls back at its next check, and the statement in flight is cancelled on the server (on a thread of
        its own, so the event loop is not blocked).
        """
        with self._lock:
            if self.cancelled:
                return not self.committing
            self.cancelled = True
            if self.committing:
                return False
            cancel_statement = self._cancel_statement
        if cancel_statement is not None:
            self._canceller = threading.Thread(
                target=_quietly, args=(cancel_statement,), name="lockkit-cancel", daemon=True
            )
            self._canceller.start()
        return True

    def settle(self) -> None:
        """Wait (bounded) until the server-side cancel triggered by ``cancel()`` has been sent."""
        canceller = self._canceller
        if canceller is not None:
            canceller.join(SETTLE_TIMEOUT)


def _quietly(cancel_statement: Callable[[], None]) -> None:
    try:
        cancel_statement()
    except Exception:  # the rollback that follows ends the statement anyway
        logger.warning("lockkit: cancelling the statement of a cancelled call failed", exc_info=True)


_current: contextvars.ContextVar[Cancellation | None] = contextvars.ContextVar(
    "lockkit_cancellation", default=None
)


def current() -> Cancellation | None:
    """The cancellation of the awaitable call running in this context, or ``None`` (a plain synchronous call)."""
    return _current.get()


@contextlib.contextmanager
def activated(cancellation: Cancellation) -> Iterator[Cancellation]:
    """Make ``cancellation`` the current one in this context for the block (tasks created in it inherit it)."""
    token = _current.set(cancellation)
    try:
        yield cancellation
    finally:
        _current.reset(token)
