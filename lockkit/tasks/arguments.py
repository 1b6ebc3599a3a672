"""Checking a task's arguments (and return value) before any SQL: JSON that survives the round trip unchanged."""

from __future__ import annotations

import json
from typing import Any

from django.utils.json import normalize_json


def json_value(value: Any, name: str) -> Any:
    """Return ``value`` as Django's ``normalize_json`` makes it, if it survives a JSON round trip unchanged.

    Django requires task arguments and return values to be JSON (``django.utils.json.normalize_json``: tuples
    become lists, bytes are decoded as UTF-8). This also refuses what JSON or the database's JSON column would
    change or reject: non-string dict keys, NaN and infinities, and NUL characters (PostgreSQL's ``jsonb`` has
    none). See https://docs.djangoproject.com/en/6.0/topics/tasks/#task-arguments.

    Args:
        value: The value.
        name: What it is, for the messages (``"args"``, ``"kwargs"``, ``"the return value"``).

    Returns:
        The normalized value.

    Raises:
        TypeError: a value of a type JSON cannot hold (an object, a set, a datetime...), or a non-string key.
        ValueError: undecodable bytes, NaN or infinity, or a NUL character.
    """
    try:
        normalized = normalize_json(value)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{name} must be JSON-serializable: {error}") from error
    try:
        text = json.dumps(normalized, allow_nan=False)
    except ValueError as error:
        raise ValueError(f"{name} must be JSON-serializable: {error} (NaN or infinity)") from error
    if "\\u0000" in text:
        raise ValueError(f"{name} must not contain NUL characters (the database's JSON column refuses them)")
    if json.loads(text) != normalized:
        raise TypeError(f"{name} must survive a JSON round trip unchanged: dict keys must be strings")
    return normalized
