"""Awaitable forms of lockkit's synchronous calls, for async views and workers.

Django runs transactions synchronously: an async caller hands the whole call to one thread with
``asgiref.sync.sync_to_async``. See https://docs.djangoproject.com/en/stable/topics/async/#async-safety.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

from lockkit.scopes.transaction import in_transaction

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
    return sync_to_async(call_and_tidy, thread_sensitive=True)


__all__ = ["awaitable", "tidy_connections"]
