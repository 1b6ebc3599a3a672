"""The unlocked-save check: in ``DEBUG`` (and under lockkit's pytest plugin), warn when a scope saves a row it did not lock.

A locked scope that reads a row without ``FOR UPDATE`` and saves it has done an unlocked read-modify-write, the bug
lockkit exists to prevent. While the check is on, each outermost scope on an alias records the rows its locking
statements return: an ``execute_wrapper`` on the scope's connection marks the moment a locking ``SELECT`` (``FOR
UPDATE``, ``FOR NO KEY UPDATE``, ``FOR SHARE``, ``LOCK IN SHARE MODE``) runs, and Django's ``post_init`` signal
records the ``(model, pk)`` of every instance built from its rows, until the next ``SELECT`` that does not lock.
Django's ``pre_save`` signal then checks each ``Model.save()`` of an existing row (``instance._state.adding`` false,
a primary key) on the scope's alias: a row the scope has not locked gets an ``UnlockedSaveWarning`` naming the model
label and the primary key when the scope has locked other rows of its model, or when the model is the scope's own
(``model=``) and the scope has locked nothing at all (no locking ``SELECT``, advisory lock or ``LOCK TABLE`` yet: the
commonest way to forget the lock; a scope that locks nothing may rely on SERIALIZABLE isolation). Rows the scope
created (``post_save`` with ``created``) are its own and never warn, nor does a backend whose transaction keeps
every other writer out (SQLite's ``BEGIN IMMEDIATE``). Nested scopes on the same alias share the outermost scope's
record (their locks belong to the same transaction).

Off (the default outside ``DEBUG``), nothing is connected, no wrapper is installed and nothing is recorded: a scope
pays one flag test. Public Django APIs only: ``connection.execute_wrapper()``, ``pre_save``/``post_init``, and the
documented ``Model._state.adding`` (read, never written), ``post_save``. See
https://docs.djangoproject.com/en/stable/topics/db/instrumentation/ and
https://docs.djangoproject.com/en/stable/ref/signals/#pre-save.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import threading
import warnings
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from django.db import connections, models
from django.db.models.signals import post_init, post_save, pre_save

from lockkit.backends import backend_for
from lockkit.errors import UnlockedSaveWarning

# Set by lockkit's pytest plugin (True) for the test session; None: follow settings.DEBUG.
_forced: bool | None = None

# A locking clause as Django's compilers write it (values are always parameters, never in the SQL text).
_LOCKING = re.compile(
    r"\bFOR\s+(?:NO\s+KEY\s+UPDATE|UPDATE|KEY\s+SHARE|SHARE)\b|\bLOCK\s+IN\s+SHARE\s+MODE\b", re.I
)
_READ = re.compile(r"^\s*\(?\s*(?:SELECT|WITH)\b", re.I)
# Locks that protect rows without returning them: advisory locks (PostgreSQL, MariaDB/MySQL) and table locks.
_OTHER_LOCK = re.compile(
    r"\bpg_(?:try_)?advisory_(?:xact_)?lock(?:_shared)?\b|\bGET_LOCK\s*\(|^\s*LOCK\s+TABLE", re.I
)


def force(value: bool | None) -> bool | None:
    """Turn the check on (``True``) or off (``False``) whatever ``settings.DEBUG`` says; ``None``: follow it.

    For lockkit's pytest plugin and tests; takes effect for scopes opened afterwards.

    Returns:
        The previous value, to put back.

    Raises:
        TypeError: ``value`` is not a ``bool`` or ``None``.
    """
    global _forced
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"value must be a bool or None, not {type(value).__name__}")
    previous, _forced = _forced, value
    return previous


def enabled() -> bool:
    """Whether scopes opened now record their locked rows and check saves (the plugin's choice, else DEBUG)."""
    if _forced is not None:
        return _forced
    return bool(settings.DEBUG)


class Record:
    """What an outermost scope's transaction on one alias has locked and created: ``(concrete model label, pk)``.

    Attributes:
        locked_any: A locking statement ran in the transaction (rows, an advisory lock, a table), or the
            transaction keeps every other writer out by itself (``Features.transaction_locks_database``).
    """

    def __init__(self, alias: str, *, locked_any: bool = False) -> None:
        """An empty record for the transaction on ``alias``."""
        self.alias = alias
        self.rows: set[tuple[str, Any]] = set()
        self.models: set[str] = set()
        self.created: set[tuple[str, Any]] = set()
        self.declared: set[str] = set()  # the models of the transaction's scopes (``model=``)
        self.locked_any = locked_any

    def add(self, model: type[models.Model], pk: Any) -> None:
        """Record ``model``'s row ``pk`` (and the same row of its multi-table parents) as locked."""
        self.locked_any = True
        for each in (model, *model._meta.get_parent_list()):
            label = _label(each)
            self.models.add(label)
            self.rows.add((label, pk))

    def locked(self, model: type[models.Model], pk: Any) -> bool | None:
        """Whether the row is recorded; ``None`` when the record has no row of ``model`` at all."""
        label = _label(model)
        if label not in self.models:
            return None
        return (label, pk) in self.rows


def _label(model: type[models.Model]) -> str:
    concrete = model._meta.concrete_model or model
    return concrete._meta.label


# The records of this thread's (or task's) open watches, outermost first; and the one whose locking statement
# ran last on its connection, whose rows post_init records until a non-locking read runs.
_records: ContextVar[tuple[Record, ...]] = ContextVar("lockkit_unlocked_records", default=())
_pending: ContextVar[Record | None] = ContextVar("lockkit_unlocked_pending", default=None)


def record_row(alias: str, model: type[models.Model], pk: Any) -> None:
    """Record a row lockkit locked without building an instance of it (``values()``), when the check is on."""
    for record in _records.get():
        if record.alias == alias:
            record.add(model, pk)
            return


def recorded(alias: str, model: type[models.Model], pk: Any) -> bool | None:
    """Whether the check's record on ``alias`` has the row (``None``: the check is off or has no row of ``model``)."""
    for record in _records.get():
        if record.alias == alias:
            return record.locked(model, pk)
    return None


class Watch:
    """The check for one scope: started after its transaction began, stopped before it ends.

    The first scope on an alias installs the execute wrapper and owns the record; a nested scope on the same alias
    shares them and installs nothing.
    """

    def __init__(self, alias: str, model: type[models.Model] | None = None) -> None:
        """Prepare the watch of a scope on ``alias`` (declared for ``model``); ``start()`` installs it."""
        self.alias = alias
        self.model = model
        self._stack: contextlib.ExitStack | None = None

    def start(self) -> None:
        """Install the wrapper and the signal receivers, unless an enclosing scope on the alias already has."""
        for enclosing in _records.get():
            if enclosing.alias == self.alias:
                if self.model is not None:
                    enclosing.declared.add(_label(self.model))
                return
        connection = connections[self.alias]
        record = Record(self.alias, locked_any=backend_for(connection).features.transaction_locks_database)
        if self.model is not None:
            record.declared.add(_label(self.model))
        stack = contextlib.ExitStack()
        stack.enter_context(connection.execute_wrapper(_wrapper(record)))
        _receivers.acquire()
        stack.callback(_receivers.release)
        _records.set((*_records.get(), record))
        stack.callback(_forget, record)
        self._stack = stack

    def stop(self) -> None:
        """Remove what ``start()`` installed (nothing for a nested scope); safe to call once on every path."""
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


def _forget(record: Record) -> None:
    # Filtered, not reset to a token: scopes on different aliases may end out of order (a generator's scope).
    _records.set(tuple(r for r in _records.get() if r is not record))
    if _pending.get() is record:
        _pending.set(None)


def _wrapper(record: Record) -> Callable[..., Any]:
    def watch_statement(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if isinstance(sql, str):
            if _LOCKING.search(sql):
                _pending.set(record)
                record.locked_any = True
            elif _OTHER_LOCK.search(sql):
                record.locked_any = True
            elif _READ.match(sql):
                _pending.set(None)  # rows built from now on were read without a lock
        return execute(sql, params, many, context)

    return watch_statement


def _built(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    """``post_init``: record the row of an instance built right after a locking statement."""
    record = _pending.get()
    if record is None:
        return
    pk = instance.pk
    if pk is not None:
        record.add(sender, pk)


def _created(
    sender: type[models.Model],
    instance: models.Model,
    created: bool = False,
    using: str | None = None,
    **kwargs: Any,
) -> None:
    """``post_save``: record a row the scope inserted (its own: no other session sees it before the commit)."""
    if not created or instance.pk is None:
        return
    for record in _records.get():
        if record.alias == using:
            record.created.add((_label(sender), instance.pk))
            return


def _saving(
    sender: type[models.Model],
    instance: models.Model,
    raw: bool = False,
    using: str | None = None,
    **kwargs: Any,
) -> None:
    """``pre_save``: warn when an existing row is saved without its lock (see the module's docstring for when)."""
    if raw or instance._state.adding:  # a fixture load; an INSERT (or a blind save of a new instance)
        return
    pk = instance.pk
    if pk is None:
        return
    for record in _records.get():
        if record.alias == using:
            if (_label(sender), pk) in record.created:
                return
            locked = record.locked(sender, pk)
            if locked is False:
                why = f"that did not lock this row (it locked other {sender._meta.label} rows)"
            elif locked is None and not record.locked_any and _label(sender) in record.declared:
                why = "that has locked nothing"
            else:
                return
            warnings.warn(
                UnlockedSaveWarning(
                    f"{sender._meta.label} pk={pk!r} saved in a locked scope on {using!r} {why}: an unlocked "
                    "read-modify-write. Read the row under the scope's lock: scope.get(Model, pk=...), "
                    "scope.lock(queryset), scope.lock_all(Model, pks=[...])"
                ),
                stacklevel=_caller_level(),
            )
            return


def _caller_level() -> int:
    """The ``stacklevel`` that points at the code calling ``save()``: past this module's and Django's frames."""
    level, frame = 1, inspect.currentframe()
    frame = frame.f_back if frame is not None else None  # _saving itself: level 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith((__name__, "django.")):
        frame = frame.f_back
        level += 1
    return level


class _Receivers:
    """Connects the two receivers while at least one watch is open in the process, and only then."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def acquire(self) -> None:
        with self._lock:
            self._count += 1
            if self._count == 1:
                post_init.connect(_built, weak=False, dispatch_uid="lockkit.unlocked.built")
                pre_save.connect(_saving, weak=False, dispatch_uid="lockkit.unlocked.saving")
                post_save.connect(_created, weak=False, dispatch_uid="lockkit.unlocked.created")

    def release(self) -> None:
        with self._lock:
            self._count -= 1
            if self._count == 0:
                post_init.disconnect(dispatch_uid="lockkit.unlocked.built")
                pre_save.disconnect(dispatch_uid="lockkit.unlocked.saving")
                post_save.disconnect(dispatch_uid="lockkit.unlocked.created")


_receivers = _Receivers()
