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

from django.core.signals import setting_changed
from django.db.models import QuerySet
from django.utils import timezone

T = TypeVar("T")
_MAX_KEYS = 32  # per queryset object: a few (alias, limit, ordering) combinations in practice

#: Bumped when ``USE_TZ`` or ``TIME_ZONE`` changes (``override_settings``): Django prepares a plain value against
#: them (a naive date-time text for a ``DateTimeField`` is made aware in ``TIME_ZONE``), so what was compiled
#: before is not used after. Part of every key here and of ``identical()``'s.
ZONE_SETTINGS = [0]


def _zone_settings_changed(setting: str, **kwargs: Any) -> None:
    if setting in ("USE_TZ", "TIME_ZONE"):
        ZONE_SETTINGS[0] += 1


setting_changed.connect(_zone_settings_changed, dispatch_uid="lockkit.claims.sql.memo.zone_settings")


class _Entry(Generic[T]):
    """What is kept for one queryset object: its values by key, and whether its SQL ignores the time zone."""

    __slots__ = ("values", "zoneless")

    def __init__(self, zoneless: bool) -> None:
        self.values: dict[Hashable, T] = {}
        self.zoneless = zoneless


class PerQueryset(Generic[T]):
    """A cache of ``compute()`` results per (queryset object, key, current time zone)."""

    def __init__(self) -> None:
        """Start empty; entries go with their queryset object."""
        self._memo: weakref.WeakKeyDictionary[QuerySet[Any], _Entry[T]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def zoneless(self, queryset: QuerySet[Any]) -> None:
        """Say that ``queryset`` (lockkit's own) compiles the same in every time zone.

        Its values are then kept without reading the current time zone (asgiref's ``Local``: about 2 % of a
        worker's instructions per task).
        """
        with self._lock:
            entry = self._memo.get(queryset)
            if entry is None:
                self._memo[queryset] = _Entry(zoneless=True)
            elif not entry.zoneless:
                entry.zoneless = True
                entry.values.clear()  # kept per time zone until now

    def get(self, queryset: QuerySet[Any], key: Hashable, compute: Callable[[], T]) -> T:
        """Return the value for ``queryset`` and ``key``, computing it on first use.

        Raises:
            Whatever ``compute`` raises (nothing is kept then).
        """
        entry = self._memo.get(queryset)
        zoneless = entry is not None and entry.zoneless
        full = (
            (key, ZONE_SETTINGS[0])
            if zoneless
            else (key, ZONE_SETTINGS[0], timezone.get_current_timezone_name())
        )
        try:
            if entry is not None:
                return entry.values[full]
        except (KeyError, TypeError):  # not computed yet, or an unhashable key (then never kept)
            pass
        value = compute()
        try:
            hash(full)
        except TypeError:
            return value
        with self._lock:
            entry = self._memo.get(queryset)
            if entry is None:
                entry = self._memo[queryset] = _Entry(zoneless=False)
            values = entry.values
            if len(values) >= _MAX_KEYS:
                values.clear()
            values[full] = value
        return value
