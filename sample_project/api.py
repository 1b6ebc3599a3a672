"""JSON request parsing and the mapping from errors to HTTP statuses, shared by the sample's views."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import ObjectDoesNotExist
from django.http import HttpRequest, HttpResponse, JsonResponse

from lockkit import LockError, LockNotAvailable, TransientLockError
from sample_project.inventory.errors import InsufficientStock

View = Callable[..., HttpResponse]
if TYPE_CHECKING:
    from _typeshed import DataclassInstance

B = TypeVar("B", bound="DataclassInstance")


class BadRequest(ValueError):
    """The request body is not the JSON object the view expects."""


def json_body(request: HttpRequest) -> dict[str, Any]:
    """Return the request body as a JSON object.

    Raises:
        BadRequest: the body is not valid JSON or not an object.
    """
    try:
        data = json.loads(request.body or b"{}")
    except ValueError as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    return data


def parse_body(request: HttpRequest, body_type: type[B]) -> B:
    """Return the request's JSON object as a ``body_type`` dataclass (whose ``__post_init__`` checks the values).

    Raises:
        BadRequest: the body is not a JSON object, lacks a required field or has an unknown one.
        TypeError, ValueError: a field's value is refused by the dataclass (both answer 400).
    """
    data = json_body(request)
    fields = {field.name: field for field in dataclasses.fields(body_type)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; expected some of {sorted(fields)}")
    missing = sorted(
        name
        for name, field in fields.items()
        if name not in data
        and field.default is dataclasses.MISSING
        and field.default_factory is dataclasses.MISSING
    )
    if missing:
        raise BadRequest(f"missing field(s) {missing}")
    return body_type(**data)


def error_response(exc: Exception, **extra: Any) -> JsonResponse | None:
    """The JSON response for an error a view reports to its client, or ``None`` for an unexpected error.

    Statuses: 400 bad input; 404 unknown object; 409 insufficient stock, and a row another request holds when
    the caller asked not to wait (``lock_not_available``); 503 with ``Retry-After`` for a transient locking
    failure (lock timeout, deadlock, serialization failure) that a client may retry in a new request.
    ``extra`` keys are added to a locking failure's body.
    """
    response: JsonResponse
    if isinstance(exc, InsufficientStock):
        body = {
            "error": "insufficient_stock",
            "sku": exc.sku,
            "requested": exc.requested,
            "available": exc.available,
        }
        return JsonResponse(body, status=409)
    if isinstance(exc, ObjectDoesNotExist):
        return JsonResponse({"error": "not_found", "detail": str(exc)}, status=404)
    if isinstance(exc, LockNotAvailable):
        response = JsonResponse({**_lock_body(exc), **extra}, status=409)
        response["Retry-After"] = "1"
        return response
    if isinstance(exc, TransientLockError):
        response = JsonResponse({**_lock_body(exc), **extra}, status=503)
        response["Retry-After"] = "1"
        return response
    if isinstance(exc, TypeError | ValueError):
        return JsonResponse({"error": "bad_request", "detail": str(exc)}, status=400)
    return None


def _lock_body(exc: LockError) -> dict[str, Any]:
    failure = exc.failure.value if exc.failure else type(exc).__name__
    return {"error": failure, "retryable": True, "attempts": exc.attempts, "sqlstate": exc.sqlstate}


def json_errors(view: View) -> View:
    """Turn the errors ``error_response`` knows into JSON responses; let anything else propagate (a 500)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except Exception as exc:
            response = error_response(exc)
            if response is None:
                raise
            return response

    return wrapper
