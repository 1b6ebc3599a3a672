"""Awaitable forms of lockkit's synchronous calls, for async views and workers.

Django runs transactions synchronously: an async caller hands the whole call to one thread with
``asgiref.sync.sync_to_async``. See https://docs.djangoproject.com/en/stable/topics/async/#async-safety.
A cancelled caller cancels the call in its thread too (``lockkit.cancellation``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

from lockkit import cancellation
from lockkit._engine.transaction import COMMIT_RESOLUTION_TIMEOUT, in_transaction
from lockkit.errors import CommitOutcomeUnknown

logger = logging.getLogger("lockkit")

# How long a caller cancelled after COMMIT was sent waits for the commit's outcome beyond the time resolving a lost
# reply may take (the operation's reconnect_within), before it is told the outcome is unknown.
COMMIT_OUTCOME_MARGIN = 5.0
# The wait with lockkit's default resolution time (a locked_operation's policy may allow more).
COMMIT_OUTCOME_WAIT = COMMIT_RESOLUTION_TIMEOUT + COMMIT_OUTCOME_MARGIN

P = ParamSpec("P")
R = TypeVar("R")


def tidy_connections() -> None:
    """Close this thread's connections that are unusable or past ``CONN_MAX_AGE``, as a request's end does.

    Django does this at the start and end of every request (``close_old_connections``); an awaitable lockkit
    call does it when it ends, so the thread it ran on keeps no connection Django would have closed
    (``CONN_MAX_AGE = 0``, the default: closed; persistent connections: kept until their age). A connection
    inside a transaction is left alone: the call ran nested in its caller's ``atomic()`` block.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or in_transaction(connection):
            continue
        connection.close_if_unusable_or_obsolete()


def awaitable(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Return an ``async`` form of ``func`` that runs it whole on one thread through ``sync_to_async``.

    ``thread_sensitive=True``, as Django's own ``aget()``/``asave()``: inside a request (Django's ASGI handler
    gives each request its own thread-sensitive context), every synchronous database call of that request, this
    one included, runs on the request's one thread and connection; outside any request the calls share one
    thread. So the retry loop, the scope, the ``on_commit`` callbacks and the connection stay on one thread, and
    two concurrent requests still run on two threads and contend in the database as sync requests do. Connections
    are tidied after the call (``tidy_connections``); a dead connection before it is discarded by lockkit's
    scopes themselves.

    When the awaiting task is cancelled (a client disconnect, ``asyncio.timeout``) before the call sent its COMMIT,
    the call is cancelled in its thread: the statement in flight is cancelled on the server, the transaction rolls
    back, no retry starts, and the caller gets its ``asyncio.CancelledError`` right away; nothing committed. When
    the COMMIT was already sent, a cancellation can no longer undo it, so the caller waits for the outcome (up to
    the call's ``reconnect_within`` plus ``COMMIT_OUTCOME_MARGIN`` seconds: ``COMMIT_OUTCOME_WAIT`` by default) and is told the truth instead of a plain cancellation: the call's result when
    it committed (the cancellation is then not raised), its error when it failed, ``CommitOutcomeUnknown`` when
    the outcome did not arrive in time.

    Args:
        func: A synchronous function.

    Returns:
        A coroutine function with ``func``'s parameters, returning what ``func`` returns.
    """

    def call_and_tidy(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        finally:
            tidy_connections()

    functools.update_wrapper(call_and_tidy, func)
    in_thread = sync_to_async(call_and_tidy, thread_sensitive=True)

    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with cancellation.activated(cancellation.Cancellation()) as waiting:
            # The task copies this context, cancellation included, and sync_to_async copies it into the thread.
            task = asyncio.ensure_future(in_thread(*args, **kwargs))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if waiting.cancel():
                _forget(task)  # it rolls back in its thread; nothing of it commits
                raise
            return await _outcome_after_commit(task, waiting)

    functools.update_wrapper(call, func)
    return call


async def _outcome_after_commit(task: asyncio.Future[R], waiting: cancellation.Cancellation) -> R:
    """The caller was cancelled after the call sent COMMIT: its outcome, or ``CommitOutcomeUnknown``.

    Waited for as long as the call may take to resolve a lost reply (its policy's ``reconnect_within``), plus a
    margin: a shorter wait would call a COMMIT unknown that the call is about to confirm.
    """
    within = COMMIT_RESOLUTION_TIMEOUT if waiting.resolve_within is None else waiting.resolve_within
    wait = within + COMMIT_OUTCOME_MARGIN
    with contextlib.suppress(asyncio.CancelledError):  # cancelled again: stop waiting, say what is known
        await asyncio.wait({task}, timeout=wait)
    if not task.done():
        _forget(task)
        raise CommitOutcomeUnknown(
            "the awaiting caller was cancelled after COMMIT was sent, and its outcome did not arrive within "
            f"{wait:g} s: the work may have committed"
        )
    error = task.exception()
    if isinstance(error, cancellation.CallCancelled):
        # The COMMIT sent did not commit (its reply was lost, the transaction was found aborted), and no retry
        # started after the cancellation: nothing committed, a plain cancellation is the truth.
        raise asyncio.CancelledError() from error
    return task.result()  # the committed result, or the call's own error (the truth about the commit)


def _forget(task: asyncio.Future[Any]) -> None:
    """Let ``task`` finish unobserved: its outcome is logged at debug level, never "never retrieved"."""

    def retrieved(done: asyncio.Future[Any]) -> None:
        if not done.cancelled() and done.exception() is not None:
            logger.debug("lockkit: a cancelled call ended with %r", done.exception())

    task.add_done_callback(retrieved)


__all__ = ["awaitable", "tidy_connections"]
