"""Values derived from one queryset object (its compiled SQL), kept while that object lives.

A ``QuerySet`` never changes through Django's API (every method returns a new one), so SQL compiled from a given
queryset object stays right for as long as the object lives, on the same alias and in the same time zone (which
date lookups and truncations compile against). A worker that builds its queryset once and claims from it in a loop
compiles it once. https://docs.djangoproject.com/en/stable/ref/models/querysets/#when-querysets-are-evaluated
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from django.db.models import QuerySet
from django.utils import timezone

T = TypeVar("T")
_MAX_KEYS = 32  # per queryset object: a few (alias, limit, ordering) combinations in practice


class PerQueryset(Generic[T]):
    """A cache of ``compute()`` results per (queryset object, key, current time zone)."""

    def __init__(self) -> None:
        """Start empty; entries go with their queryset object."""
        self._memo: weakref.WeakKeyDictionary[QuerySet[Any], dict[Hashable, T]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, queryset: QuerySet[Any], key: Hashable, compute: Callable[[], T]) -> T:
        """Return the value for ``queryset`` and ``key``, computing it on first use.

        Raises:
            Whatever ``compute`` raises (nothing is kept then).
        """
        full = (key, timezone.get_current_timezone_name())
        try:
            per = self._memo.get(queryset)
            if per is not None:
                return per[full]
        except (KeyError, TypeError):  # not computed yet, or an unhashable key (then never kept)
            pass
        value = compute()
        try:
            hash(full)
        except TypeError:
            return value
        with self._lock:
            per = self._memo.setdefault(queryset, {})
            if len(per) >= _MAX_KEYS:
                per.clear()
            per[full] = value
        return value
