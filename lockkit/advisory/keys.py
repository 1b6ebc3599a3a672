"""Advisory-lock keys: validating ``int``/``str``/``(namespace, key)`` keys and hashing text to 64 bits, stably.

The hash is part of lockkit's public contract (documented in docs/advisory.md): changing it would let two versions
of an application hold "the same" lock at once, so it is pinned by tests and never depends on Python's ``hash()``.
It is django-pglock's (``pglock.advisory(text)``), so a ``str`` key is the same PostgreSQL lock in both libraries.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# MariaDB/MySQL refuse GET_LOCK names longer than 64 characters.
MAX_LOCK_NAME = 64
_NAME_PREFIX = "lockkit"
# Room left for the database name in "lockkit:<database>:k<16 hex digits>".
_MAX_READABLE_DATABASE = MAX_LOCK_NAME - len(_NAME_PREFIX) - len("::k") - 16

AdvisoryKeyLike = int | str | tuple[int | str, int | str]


def hash_text(text: str, *, namespace: str | None = None) -> int:
    """Hash text to a signed 64-bit advisory-lock key: the first 8 bytes of SHA-256 of its UTF-8, little-endian.

    django-pglock's hash of a ``str`` lock id (``pglock.advisory(text).int_lock_id``), so ``advisory_lock(text)``
    and ``pglock.advisory(text)`` exclude each other on PostgreSQL. The same in every process, Python version and
    platform, and reproducible in SQL (docs/advisory.md, "Keys"). With a ``namespace``
    (``settings.LOCKKIT["ADVISORY_NAMESPACE"]``), the hashed bytes are the namespace's UTF-8, a NUL byte, then the
    text's: a key space of the project's own.

    Raises:
        TypeError: ``namespace`` is neither ``None`` nor a ``str``.
        ValueError: ``text`` or ``namespace`` cannot be encoded as UTF-8 (a lone surrogate); ``namespace`` is empty
            or contains NUL (the separator: two namespaces would share keys). The setting is checked the same way
            (``lockkit.conf.check_advisory_namespace``).
    """
    if namespace is not None and not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str or None, not {type(namespace).__name__}")
    if namespace is not None and (not namespace or "\x00" in namespace):
        raise ValueError(f"namespace must be a non-empty str without NUL, got {namespace!r}")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"key must be encodable as UTF-8: {exc}") from None
    if namespace is not None:
        try:
            data = namespace.encode("utf-8") + b"\x00" + data
        except UnicodeEncodeError as exc:
            raise ValueError(f"namespace must be encodable as UTF-8: {exc}") from None
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little", signed=True)


@dataclass(frozen=True)
class AdvisoryKey:
    """A validated advisory-lock key, in the forms each database takes it.

    Attributes:
        value: The signed 64-bit key (PostgreSQL's ``bigint`` form): the ``int`` itself, or the hash of a ``str``
            or of a ``(namespace, key)`` pair that contains a ``str``.
        pair: For a ``(namespace, key)`` pair of two 32-bit ints, PostgreSQL's two-key form; else ``None``.
        source: The key as given, for messages.
    """

    value: int
    pair: tuple[int, int] | None
    source: AdvisoryKeyLike

    def lock_name(self, database: str) -> str:
        """Return the MariaDB/MySQL ``GET_LOCK`` name: per database (like PostgreSQL), at most 64 characters.

        ``lockkit:<database>:k<16 hex digits of the 64-bit key>`` (``p`` for a two-int pair); a database name
        too long for the limit is replaced by the first 16 hex digits of its SHA-256.
        """
        if len(database) > _MAX_READABLE_DATABASE:
            database = hashlib.sha256(database.encode("utf-8")).hexdigest()[:16]
        kind = "p" if self.pair is not None else "k"
        return f"{_NAME_PREFIX}:{database}:{kind}{self.value & 0xFFFF_FFFF_FFFF_FFFF:016x}"

    def __str__(self) -> str:
        """Show the key as given (and its 64-bit hash for text)."""
        if isinstance(self.source, int):
            return str(self.source)
        return f"{self.source!r} (hashed to {self.value})" if self.pair is None else repr(self.source)


def _check_int(value: int, name: str, low: int, high: int, bits: int) -> int:
    if not low <= value <= high:
        raise ValueError(f"{name} must be a signed {bits}-bit integer ({low}..{high}), got {value}")
    return value


def _check_part(value: object, name: str) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{name} must be an int or a str, not {type(value).__name__}")
    if isinstance(value, str) and not value:
        raise ValueError(f"{name} must not be an empty string")
    return value


def advisory_key(key: object, *, namespace: str | None = None) -> AdvisoryKey:
    """Validate an advisory-lock key and compute its database forms, before any SQL runs.

    Args:
        key: An ``int`` (a signed 64-bit value, used as is), a non-empty ``str`` (hashed by ``hash_text``), or a
            ``(namespace, key)`` tuple: two ints in the signed 32-bit range use PostgreSQL's two-key form
            (``pg_advisory_lock(int, int)``, a key space of its own); a pair with a ``str`` in it is hashed as the
            compact JSON text ``["namespace","key"]``.
        namespace: The project's namespace (``settings.LOCKKIT["ADVISORY_NAMESPACE"]``, validated by the caller),
            mixed into every hash (``hash_text``); ``int`` keys and pairs of two ints are used as they are.

    Returns:
        The ``AdvisoryKey``.

    Raises:
        TypeError: ``key`` is a ``bool``, or neither an ``int``, a ``str`` nor a 2-tuple of them.
        ValueError: an ``int`` out of range, an empty string, a tuple that is not a pair, text that is not UTF-8;
            for a hashed key, a bad ``namespace`` (as ``hash_text``).
    """
    if isinstance(key, bool):
        raise TypeError("key must be an int, a str or a (namespace, key) tuple, not bool")
    if isinstance(key, int):
        return AdvisoryKey(_check_int(key, "key", INT64_MIN, INT64_MAX, 64), None, key)
    if isinstance(key, str):
        if not key:
            raise ValueError("key must not be an empty string")
        return AdvisoryKey(hash_text(key, namespace=namespace), None, key)
    if isinstance(key, tuple):
        if len(key) != 2:
            raise ValueError(f"key must be a (namespace, key) pair, got a tuple of {len(key)} items")
        outer, inner = _check_part(key[0], "the namespace of key"), _check_part(key[1], "the key of key")
        if isinstance(outer, int) and isinstance(inner, int):
            first = _check_int(outer, "the namespace of key", INT32_MIN, INT32_MAX, 32)
            second = _check_int(inner, "the key of key", INT32_MIN, INT32_MAX, 32)
            combined = int.from_bytes(
                first.to_bytes(4, "big", signed=True) + second.to_bytes(4, "big", signed=True),
                "big",
                signed=True,
            )
            return AdvisoryKey(combined, (first, second), (first, second))
        text = json.dumps([outer, inner], ensure_ascii=False, separators=(",", ":"))
        return AdvisoryKey(hash_text(text, namespace=namespace), None, (outer, inner))
    raise TypeError(f"key must be an int, a str or a (namespace, key) tuple, not {type(key).__name__}")


__all__ = ["AdvisoryKey", "AdvisoryKeyLike", "advisory_key", "hash_text"]
