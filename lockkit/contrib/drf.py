"""Django REST framework: lockkit's transient errors as ``503 Service Unavailable`` with ``Retry-After``.

Name the handler in the settings (the ``drf`` extra installs DRF)::

    REST_FRAMEWORK = {"EXCEPTION_HANDLER": "lockkit.contrib.drf.exception_handler"}

A ``lockkit.TransientLockError`` that reaches the view (``LockTimeout``, ``LockNotAvailable``, ``DeadlockDetected``,
``SerializationFailure``: the retries, if any, are spent) becomes a 503 response whose ``Retry-After`` header tells
the client when to try again; everything else goes to DRF's own handler, unchanged. See
https://www.django-rest-framework.org/api-guide/exceptions/#custom-exception-handling.
"""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from lockkit.errors import TransientLockError

#: Seconds a client is told to wait (``Retry-After``) unless the caller of ``exception_handler`` says otherwise.
RETRY_AFTER = 1


class Busy(APIException):
    """The 503 that a ``TransientLockError`` becomes; its ``code`` is the failure kind (``"lock_timeout"``...).

    ``wait`` is DRF's own way of setting ``Retry-After`` (as for ``Throttled``).
    """

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "busy"

    def __init__(self, code: str, wait: int) -> None:
        """Build the error for one failure kind and a wait in seconds."""
        super().__init__(f"The data is busy ({code}): try again in {wait} second(s).", code)
        self.wait = wait


def exception_handler(
    exc: Exception, context: dict[str, Any], *, retry_after: int = RETRY_AFTER
) -> Response | None:
    """DRF's exception handler, answering lockkit's transient errors with 503 and ``Retry-After``.

    The request's transaction (``ATOMIC_REQUESTS``) is rolled back as for any error DRF handles. To tell clients
    another wait, name a function of your own in the settings that calls this one with ``retry_after``.

    Args:
        exc: The exception the view raised.
        context: DRF's context (``view``, ``request``...), passed on to DRF's handler.
        retry_after: Whole seconds for the ``Retry-After`` header, at least 1 (default 1).

    Returns:
        A 503 ``Response`` for a ``lockkit.TransientLockError``; otherwise what DRF's default handler returns
        (``None`` for an exception it does not handle, which Django answers with a 500).

    Raises:
        TypeError: ``retry_after`` is not an ``int``.
        ValueError: ``retry_after`` is below 1.
    """
    if isinstance(retry_after, bool) or not isinstance(retry_after, int):
        raise TypeError(f"retry_after must be an int (seconds), not {type(retry_after).__name__}")
    if retry_after < 1:
        raise ValueError(f"retry_after must be at least 1 second, got {retry_after}")
    if isinstance(exc, TransientLockError) and exc.failure is not None:
        exc = Busy(exc.failure.value, retry_after)
    return drf_exception_handler(exc, context)


__all__ = ["RETRY_AFTER", "Busy", "exception_handler"]
