"""Checking a task's arguments (and return value) before any SQL: JSON that survives the round trip unchanged."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from django.utils.json import normalize_json

#: The most lists/dicts a stored value may nest: MariaDB's JSON columns refuse documents deeper than 32 levels
#: (the innermost scalar is one), and the arguments are stored inside a ``{"args": [...]}`` envelope. The same
#: limit on every database, so a task that enqueues on one enqueues on all.
MAX_DEPTH = 30

#: The longest error text (a traceback) stored, in characters: longer ones keep their start and their end.
MAX_TEXT = 64 * 1024


def json_value(value: Any, name: str) -> Any:
    """Return ``value`` as Django's ``normalize_json`` makes it, if it survives a JSON round trip unchanged.

    Django requires task arguments and return values to be JSON (``django.utils.json.normalize_json``: tuples
    become lists, bytes are decoded as UTF-8). This also refuses what JSON or the database's JSON column would
    change or reject: non-string dict keys, NaN and infinities, NUL characters (PostgreSQL's ``jsonb`` has
    none), lone surrogates (not Unicode text: PostgreSQL and MariaDB refuse them) and lists/dicts nested more
    than ``MAX_DEPTH`` deep (MariaDB refuses them). See
    https://docs.djangoproject.com/en/6.0/topics/tasks/#task-arguments.

    Args:
        value: The value.
        name: What it is, for the messages (``"args"``, ``"kwargs"``, ``"the return value"``).

    Returns:
        The normalized value.

    Raises:
        TypeError: a value of a type JSON cannot hold (an object, a set, a datetime...), or a non-string key.
        ValueError: undecodable bytes, NaN or infinity, a NUL character, a lone surrogate, or nesting deeper
            than ``MAX_DEPTH`` (a list that contains itself included).
    """
    if (type(value) is list or type(value) is dict) and not value:
        return type(value)()  # no arguments (most tasks' kwargs): nothing to check
    _check_depth(value, name)
    try:
        normalized = normalize_json(value)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{name} is not JSON serializable: {error}") from error
    try:
        text = json.dumps(normalized, allow_nan=False, ensure_ascii=False)
    except ValueError as error:
        hint = " (NaN or infinity)" if "float" in str(error) else ""  # else an int too long to write
        raise ValueError(f"{name} is not JSON serializable: {error}{hint}") from error
    if "\\u0000" in text and _ESCAPED_NUL.search(text):  # not a backslash written before "u0000"
        raise ValueError(f"{name} must not contain NUL characters (the database's JSON column refuses them)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{name} must be valid Unicode text: a lone surrogate {text[error.start]!r} (the database's JSON "
            f"column refuses it)"
        ) from None
    if json.loads(text) != normalized:
        raise TypeError(f"{name} must survive a JSON round trip unchanged: dict keys must be strings")
    return normalized


#: A NUL as JSON writes it: ``\u0000`` after an even number of backslashes (``\\`` is a backslash of the text).
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class FloatKeepingEncoder(json.JSONEncoder):
    """JSON in which every float keeps a fractional part, so each vendor's JSON column gives back a float.

    PostgreSQL's ``jsonb`` stores numbers as ``numeric``: Python writes ``1e16`` as ``1e+16``, which comes back as
    ``10000000000000000`` (an ``int``), and ``1e300`` as an ``int`` of another value. Written ``10000000000000000.0``
    (positional, every digit of Python's shortest repr, and ``.0``), a float keeps its scale and comes back as the
    same float. Other floats are written as Python writes them (their repr already has a ``.`` or an exponent
    below zero, which ``numeric`` shows as a fraction). Used as the ``encoder`` of the task table's JSON fields.
    """

    def encode(self, o: Any) -> str:
        """``o`` as JSON text, floats written so that they stay floats.

        Raises:
            TypeError, ValueError: as ``json.dumps`` (a value JSON cannot hold, NaN or infinity).
        """
        text = json.dumps(o, allow_nan=False)
        if "e+" not in text:  # no float written with a positive exponent: nothing for jsonb to rewrite
            return text
        return _keeping_floats(o)

    def iterencode(self, o: Any, _one_shot: bool = False) -> Iterator[str]:
        """``encode(o)`` as one chunk."""
        yield self.encode(o)


class TextIfUnreadable(json.JSONDecoder):
    """JSON decoding in which a document Python cannot read fails as invalid JSON (``JSONField`` gives its text).

    Valid JSON that Python refuses (nested deeper than its recursion limit, an integer longer than its digit
    limit), put in a row by hand or by another program, would otherwise raise ``RecursionError`` or
    ``ValueError`` wherever the row is read: in a worker's claim, before any attempt could record it, on every
    worker that claims it. Read as text, it fails its attempt as any malformed row does. Used as the ``decoder``
    of the task table's JSON fields. See
    https://docs.djangoproject.com/en/stable/ref/models/fields/#django.db.models.JSONField.decoder.
    """

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        """``s`` decoded.

        Raises:
            json.JSONDecodeError: ``s`` is not JSON, or is JSON Python cannot read (the reason in its message).
        """
        try:
            return super().decode(s, *args, **kwargs)
        except json.JSONDecodeError:
            raise
        except (RecursionError, ValueError) as unreadable:
            raise json.JSONDecodeError(f"JSON Python cannot read: {unreadable}", s[:100], 0) from None


def _keeping_floats(value: Any) -> str:
    if isinstance(value, float):
        text = repr(value)
        return f"{Decimal(text):f}.0" if "e+" in text else text
    if isinstance(value, Mapping):
        return (
            "{" + ",".join(f"{json.dumps(key)}:{_keeping_floats(item)}" for key, item in value.items()) + "}"
        )
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_keeping_floats(item) for item in value) + "]"
    return json.dumps(value, allow_nan=False)


def storable_text(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` made storable in any database's JSON column: NULs and lone surrogates escaped, ``limit`` long at most.

    For texts lockkit records (tracebacks), which must never make the write that records an outcome fail.
    """
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _check_depth(value: Any, name: str) -> None:
    """Refuse lists/dicts nested deeper than ``MAX_DEPTH`` (iteratively: a deep value never recurses here)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, Sequence) and not isinstance(item, (str, bytes, bytearray)):
            children = item
        else:
            continue
        if depth + 1 > MAX_DEPTH:
            raise ValueError(
                f"{name} must not nest lists/dicts more than {MAX_DEPTH} deep (MariaDB's JSON columns refuse it)"
            )
        stack.extend((child, depth + 1) for child in children)
