"""The worker's own handling of ``SIGTERM``/``SIGINT``: the first asks it to stop, a second ends the process.

The handler only sets a flag (``Worker.stop()``): it never raises into the code it interrupts. So a
``KeyboardInterrupt`` or ``SystemExit`` that reaches a running attempt was raised by the task itself, and is
recorded as the task's error. See docs/tasks.md, "Stopping a worker".
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger("lockkit.tasks.worker")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals(worker_id: str, stop: Callable[[], None], stopping: threading.Event) -> Iterator[None]:
    """For the block, ``SIGTERM``/``SIGINT`` call ``stop()``; a second one exits the process at once (status 1).

    Installed only on the main thread (elsewhere Python cannot install handlers, and the signals go to the main
    thread anyway); the previous handlers are restored on exit. Python runs a handler only when the main thread
    next runs Python code, which a task inside a long C call (a blocking query of a driver that retries
    interrupted calls, a hash) may not do for minutes: each signal is also written to a pipe
    (``signal.set_wakeup_fd``) that a thread of the worker reads, so the stop begins at once whatever the main
    thread is doing (found by a review: claimed tasks not started stayed ``RUNNING`` until the task's call ended).

    The handler and the thread each count the signals they see, and either stops at its own second one: one
    signal seen by both is never taken for two. The handler never touches the wakeup fd (a task's asyncio loop
    may own it for a while; ``SignalsKept`` puts it back after the task); a process a task forked keeps the
    handler (as before) but not the pipe.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    begun = threading.Event()
    beginning = threading.Lock()

    def begin(number: int) -> None:
        with beginning:
            if begun.is_set():
                return
            begun.set()
        # WARNING, as Celery's "Warm shutdown": shown on stderr even where the project configures no logging.
        logger.warning(
            "worker %s: %s: stopping: finishing the running task(s), giving back the claimed ones not started "
            "(a second signal stops at once)",
            worker_id,
            _name(number),
        )
        stop()

    def seen(count: list[int], number: int) -> None:
        count[0] += 1
        if count[0] >= 2:
            logger.warning("worker %s: second %s: stopping at once", worker_id, _name(number))
            os._exit(1)
        begin(number)

    handled = [0]  # by the handler, on the main thread
    piped = [0]  # by the pipe's thread

    def on_signal(number: int, frame: FrameType | None) -> None:
        seen(handled, number)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    watch: _Watch | None = None
    try:
        watch = _Watch(lambda number: seen(piped, number))
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watch is not None:
            watch.close()


class _Watch:
    """The stop signals, read from the pipe ``signal.set_wakeup_fd`` writes each signal's number to, on a thread."""

    def __init__(self, received: Callable[[int], None]) -> None:
        """Make the pipe, make it the wakeup fd and start reading it."""
        self.received = received
        self.reader, self.writer = os.pipe()
        try:
            os.set_blocking(self.writer, False)  # as set_wakeup_fd requires
            self.previous = signal.set_wakeup_fd(self.writer, warn_on_full_buffer=False)
            self.thread = threading.Thread(target=self._read, name="lockkit-worker-signals", daemon=True)
            self.thread.start()
        except BaseException:
            os.close(self.writer)
            os.close(self.reader)
            raise

    def _read(self) -> None:
        if hasattr(signal, "pthread_sigmask"):  # the signals stay the main thread's (see block_stop_signals)
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        while True:
            try:
                data = os.read(self.reader, 64)
            except OSError:
                return
            if not data:
                return  # closed
            for number in data:
                if number in STOP_SIGNALS:
                    self.received(number)

    def close(self) -> None:
        """Put back the wakeup fd found (unless another took the pipe's place meanwhile), end the thread."""
        current = signal.set_wakeup_fd(self.previous)
        if current not in (self.writer, -1):
            signal.set_wakeup_fd(current)  # not the pipe's: whoever set it keeps it
        os.close(self.writer)
        self.thread.join(timeout=5)
        os.close(self.reader)


def wakeup_fd() -> int:
    """The wakeup fd now set (``-1``: none); read by setting it back at once (the only way Python offers)."""
    current = signal.set_wakeup_fd(-1)
    if current != -1:
        signal.set_wakeup_fd(current, warn_on_full_buffer=False)
    return current


def _name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def block_stop_signals() -> set[int] | None:
    """Block SIGTERM/SIGINT on this thread if it is the main thread (POSIX); the previous mask, else ``None``.

    A thread inherits its creator's mask: threads started meanwhile never receive them, so the kernel delivers
    them to the main thread, whose blocking calls (a task's sleep, a query) are interrupted and whose handler runs
    at once, rather than when the main thread next runs Python code.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return None
    return {int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)}


def restore_signals(previous: set[int] | None) -> None:
    """Restore the mask ``block_stop_signals()`` returned."""
    if previous is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


#: The signals whose handlers a task run on the main thread may change, put back after it.
KEPT_SIGNALS = (*STOP_SIGNALS, signal.SIGALRM)

#: Seconds between two checks of ``KEPT_SIGNALS``' handlers (``signal.getsignal`` costs about 10 microseconds).
HANDLERS_CHECKED_EVERY = 1.0


class SignalsKept:
    """Puts back what a task run on the main thread changed: its alarm timer at once, the handlers within a second.

    A task that arms ``signal.setitimer``/``alarm`` with a handler that raises (a time limit of its own) and returns
    would otherwise interrupt the worker's loop, or the next task, when the timer fires: a timer the task armed
    (none ran before it) is cancelled when it returns (``task_call``), ``SIGALRM`` ignored meanwhile so that the
    task's handler cannot run after its task; a timer of the process's own (a test runner's) is left as it runs. A task that
    changes the handler of ``SIGTERM``, ``SIGINT`` or ``SIGALRM`` (ignoring ``SIGTERM`` would leave the worker
    unstoppable) has it put back, checked after a task at most every ``HANDLERS_CHECKED_EVERY`` seconds, and so has
    the worker's signal wakeup fd (``stop_on_signals``). Built and
    used on the main thread (Python installs handlers only there); elsewhere ``around_task`` changes nothing.
    """

    def __init__(self) -> None:
        """Record the handlers as they are now (the worker's own, installed)."""
        self.here = threading.current_thread() is threading.main_thread()
        self.handlers = {sig: signal.getsignal(sig) for sig in KEPT_SIGNALS} if self.here else {}
        #: The wakeup fd of the worker's signal pipe (``stop_on_signals``), put back when a task changed it.
        self.wakeup = wakeup_fd() if self.here else -1
        self._task_timer = False  # whether no timer ran before the current task (so one running now is its)
        self._checked = time.monotonic()

    def _on_main(self) -> bool:
        """Whether this call runs on the main thread, where this was built (runner threads share the object)."""
        return self.here and threading.current_thread() is threading.main_thread()

    @contextmanager
    def task_call(self) -> Iterator[None]:
        """Call a task's function in the block: an alarm timer it armed is cancelled the moment it ends.

        Before its outcome is written: a timer firing just after the task returned would otherwise raise in the
        worker's write (found by a review).
        """
        if not self._on_main():
            yield
            return
        timer = signal.getitimer(signal.ITIMER_REAL)
        self._task_timer = not any(timer)
        try:
            yield
        finally:
            self.timer_off()

    def timer_off(self) -> None:
        """Cancel the alarm timer the task of the last ``task_call`` armed, if any (again: after its exception).

        A timer that fires while the task's function ends can raise before its cancel begins: the attempt calls
        this again before it records the error, so no timer the task armed outlives its attempt.
        """
        if self._on_main() and self._task_timer:
            self._cancel_timer()

    def _cancel_timer(self) -> None:
        """Cancel the timer a task armed; what its handler raises meanwhile (it fires right now) is logged.

        Python runs a pending handler at any line here, before ``SIG_IGN`` is in place: each step is tried again
        until the timer is off (found by a review: an exception escaped before it was cancelled).
        """
        late: BaseException | None = None
        while True:
            try:
                if any(signal.getitimer(signal.ITIMER_REAL)):
                    signal.signal(signal.SIGALRM, signal.SIG_IGN)
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    signal.signal(signal.SIGALRM, self.handlers[signal.SIGALRM])
                    logger.warning("a task left an alarm timer armed: cancelled")
                break
            except BaseException as fired:  # the task's own handler: its task has ended
                late = fired
        if late is not None:
            logger.warning("a task's alarm timer fired after the task ended, ignored: %r", late)

    @contextmanager
    def around_task(self) -> Iterator[None]:
        """Run a task's attempt in the block; put back the wakeup fd after it, the handlers at most every second."""
        try:
            yield
        finally:
            if self._on_main():
                self._wakeup_back()
                now = time.monotonic()
                if now - self._checked >= HANDLERS_CHECKED_EVERY:
                    self._checked = now
                    self.put_back()

    def put_back(self) -> None:
        """Put back the handlers a task changed since they were recorded (logged); also when the worker idles."""
        if not self._on_main():
            return
        for sig, handler in self.handlers.items():
            if signal.getsignal(sig) != handler:
                logger.warning("a task changed the handler of %s: put back", _name(sig))
                signal.signal(sig, handler)
        self._wakeup_back()

    def _wakeup_back(self) -> None:
        """Put back the worker's signal wakeup fd (an asyncio loop with signal handlers leaves -1 when it closes)."""
        if self.wakeup != -1:
            current = signal.set_wakeup_fd(self.wakeup, warn_on_full_buffer=False)
            if current != self.wakeup:
                logger.warning("a task changed the signal wakeup fd: put back")
