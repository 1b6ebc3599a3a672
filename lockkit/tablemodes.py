"""The arguments of ``LockScope.lock_table``: PostgreSQL's eight table lock modes, and the models to lock.

Both are checked here before any SQL runs, so a vendor only ever receives one of the eight mode names and the
concrete, installed model classes whose tables it quotes.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from django.apps import apps
from django.db import models


class TableLockMode(StrEnum):
    """PostgreSQL's table lock modes, weakest first; each value is the mode's name as ``LOCK TABLE`` spells it.

    A ``str`` enum: ``TableLockMode.EXCLUSIVE == "EXCLUSIVE"``, so django-pglock's constants
    (``pglock.EXCLUSIVE`` is the string ``"EXCLUSIVE"``) are accepted as they are. Which modes conflict with
    which, and what each is for, is the table in
    https://www.postgresql.org/docs/current/explicit-locking.html#LOCKING-TABLES. In short: ``SHARE`` keeps
    writers out while other ``SHARE`` holders and readers go on; ``EXCLUSIVE`` keeps out everything but plain
    reads (``SELECT`` without ``FOR UPDATE``); ``ACCESS EXCLUSIVE`` keeps out plain reads too.
    """

    ACCESS_SHARE = "ACCESS SHARE"
    ROW_SHARE = "ROW SHARE"
    ROW_EXCLUSIVE = "ROW EXCLUSIVE"
    SHARE_UPDATE_EXCLUSIVE = "SHARE UPDATE EXCLUSIVE"
    SHARE = "SHARE"
    SHARE_ROW_EXCLUSIVE = "SHARE ROW EXCLUSIVE"
    EXCLUSIVE = "EXCLUSIVE"
    ACCESS_EXCLUSIVE = "ACCESS EXCLUSIVE"


def table_lock_mode(value: object, name: str = "mode") -> TableLockMode:
    """Return ``value`` as a ``TableLockMode``.

    Accepts a ``TableLockMode`` or a string naming one of the eight modes, in any case, with spaces or
    underscores between its words (``"share row exclusive"``, ``"SHARE_ROW_EXCLUSIVE"``).

    Raises:
        TypeError: ``value`` is not a string.
        ValueError: ``value`` names no PostgreSQL table lock mode.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a TableLockMode or a string, not {type(value).__name__}")
    spelled = " ".join(value.replace("_", " ").split()).upper()
    try:
        return TableLockMode(spelled)
    except ValueError:
        known = ", ".join(repr(mode.value) for mode in TableLockMode)
        raise ValueError(f"{name}={value!r} is not a PostgreSQL table lock mode (one of {known})") from None


def table_models(targets: Iterable[object], name: str = "model") -> list[type[models.Model]]:
    """Return the models whose tables to lock, each once, in the order given.

    A target is a model class or an ``"app_label.ModelName"`` string (``apps.get_model``). A proxy model is its
    concrete model's table; an unmanaged model is locked as its ``db_table`` names it (Django does not create it:
    it must exist, a view included).

    Raises:
        TypeError: a target is an instance (lock its row with ``scope.get()``), a queryset or anything else.
        ValueError: no target; a string that names no installed model; an abstract model (no table) or a
            swapped one (``auth.User`` replaced by ``AUTH_USER_MODEL``: lock the model that replaces it).
    """
    found: list[type[models.Model]] = []
    for target in targets:
        model = _model(target, name)
        concrete = model._meta.concrete_model or model
        if concrete not in found:
            found.append(concrete)
    if not found:
        raise ValueError(f"{name}: lock_table() needs at least one model")
    return found


def _model(target: object, name: str) -> type[models.Model]:
    if isinstance(target, str):
        try:
            model = apps.get_model(target)
        except (LookupError, ValueError) as exc:
            raise ValueError(
                f"{name}={target!r} names no installed model (write 'app_label.ModelName'): {exc}"
            ) from None
    elif isinstance(target, type) and issubclass(target, models.Model):
        model = target
    elif isinstance(target, models.Model):
        raise TypeError(
            f"{name} must be a model class or an 'app_label.ModelName' string, not a {type(target).__name__} "
            "instance: lock_table() locks a whole table; to lock one row use scope.get(instance)"
        )
    else:
        raise TypeError(
            f"{name} must be a model class or an 'app_label.ModelName' string, not {type(target).__name__}"
        )
    meta = model._meta
    if meta.abstract:
        raise ValueError(f"{name}: {model.__name__} is an abstract model: it has no table to lock")
    if meta.swapped:
        raise ValueError(
            f"{name}: {meta.label} is swapped for {meta.swapped}: its table does not exist; lock {meta.swapped}"
        )
    return model


__all__ = ["TableLockMode", "table_lock_mode", "table_models"]
