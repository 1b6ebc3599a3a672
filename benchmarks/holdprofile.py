"""Where a hot row's lock hold goes: the Python that runs between the locking statement's reply and the COMMIT.

Under contention every waiter pays this window, so it is profiled on its own. A ``sys.setprofile`` tracer runs
around each operation and watches psycopg: the window opens when psycopg's ``Connection.wait`` returns the reply of
a statement containing ``FOR UPDATE``, and closes when the COMMIT is on its way: the call of psycopg's
``Connection.commit`` after a plain ``save()``, or the ``Connection.wait`` that sends ``UPDATE ...; COMMIT`` after
``locked_update``'s decision. (No ``execute_wrapper``: ``locked_update`` takes its scope path when one is installed.)
Time inside psycopg's ``Connection.wait`` before that (the ``UPDATE``'s own round trip on the ``save()`` path:
psycopg's send, the server, the reply) is counted apart and not traced inside. The tracer's own cost inflates every
figure (about a microsecond per call), so read them as a ranking and a count of calls, not as absolute costs.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from django.db import connections

from benchmarks import ops

#: Operation -> how its window ends: at psycopg's commit, or at the send of the row's UPDATE (with the COMMIT).
MODES: dict[str, str] = {
    "reserve_hand": "commit",
    "reserve_lockkit": "commit",
    "reserve_locked_update": "update",
}
_COMMIT_CODE = psycopg.Connection.commit.__code__
_EXECUTE_CODE = psycopg.Cursor.execute.__code__  # Django's cursors (client- or server-binding) inherit it
_WAIT_CODE = psycopg.Connection.wait.__code__
_WAIT = "psycopg Connection.wait (send, server, reply)"
_ROOT = str(Path(__file__).resolve().parents[1]) + "/"


class _Window:
    """One operation's window: a stack of open calls and the totals per function."""

    def __init__(self, end: str) -> None:
        self.end = end
        self.active = False
        self.locking = False  # the statement being executed, before the window, contains FOR UPDATE
        self.update_sent = False
        self.stack: list[list[Any]] = []  # [key, start, child time]
        self.inside_wait = 0  # calls open inside psycopg's wait (not traced one by one)
        self.own: dict[str, float] = {}
        self.cum: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.wait = 0.0
        self.started = 0.0
        self.total = 0.0
        self.windows = 0
        self.windows_left = True

    def open(self, now: float) -> None:
        self.active, self.locking, self.update_sent, self.stack, self.inside_wait = True, False, False, [], 0
        self.started = now

    def close(self, now: float) -> None:
        while self.stack:
            self._pop(now)
        self.total += now - self.started
        self.windows += 1
        self.active = False
        self.windows_left = False  # one window per operation

    def _pop(self, now: float) -> None:
        key, start, child = self.stack.pop()
        elapsed = now - start
        if key == _WAIT:
            self.wait += elapsed
        self.own[key] = self.own.get(key, 0.0) + elapsed - child
        self.cum[key] = self.cum.get(key, 0.0) + elapsed
        self.calls[key] = self.calls.get(key, 0) + 1
        if self.stack:
            self.stack[-1][2] += elapsed

    def trace(self, frame: FrameType, event: str, arg: Any) -> None:
        now = time.perf_counter()
        if not self.active:  # before the window (or after it closed): watch for the locking statement's reply
            if event == "call" and frame.f_code is _EXECUTE_CODE and self.windows_left:
                self.locking = "FOR UPDATE" in _query(frame)
            elif event == "return" and frame.f_code is _WAIT_CODE and self.locking:
                self.open(time.perf_counter())
            return
        if self.inside_wait:
            if event in ("call", "c_call"):
                self.inside_wait += 1
            else:
                self.inside_wait -= 1
                if not self.inside_wait:
                    self._pop(now)
            return
        if event == "call":
            code = frame.f_code
            if code is _EXECUTE_CODE and _query(frame).lstrip().upper().startswith("UPDATE"):
                self.update_sent = True
            if code is _WAIT_CODE:
                if self.end == "update" and self.update_sent:
                    self.close(now)
                    return
                self.stack.append([_WAIT, now, 0.0])
                self.inside_wait = 1
                return
            if self.end == "commit" and code is _COMMIT_CODE:
                self.close(now)
                return
            self.stack.append([f"{_short(code.co_filename)}:{code.co_firstlineno}({code.co_name})", now, 0.0])
        elif event == "c_call":
            self.stack.append([f"~.{getattr(arg, '__name__', '?')}", now, 0.0])
        elif self.stack:  # return, c_return, c_exception of a call opened inside the window
            self._pop(now)


def profile(name: str, count: int, top: int = 15) -> dict[str, Any]:
    """Profile the lock-hold window of ``count`` operations ``name`` (after ``count // 10`` unprofiled ones)."""
    absent = ops.missing(name)
    if absent:
        raise RuntimeError(absent)
    op = ops.build(name, random.Random(5), 0)
    for _ in range(max(1, count // 10)):
        op()
    window = _Window(MODES[name])
    for _ in range(count):
        window.windows_left = True
        sys.setprofile(window.trace)
        try:
            op()
        finally:
            sys.setprofile(None)
        if window.active:  # the operation ended without the expected send: the window ends with it
            window.close(time.perf_counter())
    connections.close_all()
    n = window.windows or 1
    entries: list[dict[str, Any]] = [
        {
            "function": key,
            "calls_per_op": window.calls[key] / n,
            "own_us_per_op": window.own[key] / n * 1e6,
            "cum_us_per_op": window.cum[key] / n * 1e6,
        }
        for key in window.own
    ]
    python = [e for e in entries if e["function"] != _WAIT]
    python.sort(key=lambda e: e["own_us_per_op"], reverse=True)
    own_code = sorted(
        (e for e in python if e["function"].startswith("lockkit/")),
        key=lambda e: e["cum_us_per_op"],
        reverse=True,
    )
    return {
        "op": name,
        "count": count,
        "windows": window.windows,
        "window_us": window.total / n * 1e6,
        "wait_us": window.wait / n * 1e6,
        "calls": sum(window.calls[e["function"]] for e in python) / n,
        "top": python[:top],
        "lockkit_top": own_code[:top],
        "lockkit_own_us": sum(e["own_us_per_op"] for e in python if e["function"].startswith("lockkit/")),
    }


def _query(frame: FrameType) -> str:
    """The text psycopg's ``Cursor.execute`` was called with (empty for a composed query)."""
    query = frame.f_locals.get("query")
    if isinstance(query, bytes):
        return query.decode(errors="replace")
    return query if isinstance(query, str) else ""


def _short(filename: str) -> str:
    if filename.startswith(_ROOT):
        return filename[len(_ROOT) :]
    for marker in ("site-packages/", "lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename
