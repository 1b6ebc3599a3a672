"""The ``OPTIONS`` of a ``lockkit.tasks.DatabaseBackend``, validated once, when the backend is built."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from lockkit.tasks.periodic import schedules
from lockkit.validation import duration, positive_int

#: Every option and its default (seconds for durations).
DEFAULTS: dict[str, Any] = {
    "database": None,
    "lease": 30.0,
    "max_attempts": 3,
    "retry_backoff": 1.0,
    "retry_backoff_max": 300.0,
    "poll_interval": 1.0,
    "notify": True,
    "task_modules": (),
    "periodic": {},
    "id_function": None,
}


@dataclass(frozen=True)
class TaskOptions:
    """A backend's options, checked.

    Attributes:
        database: The database alias of the task table; ``None`` for ``router.db_for_write`` of the task model.
        lease: Seconds a worker's claim on a task lasts without a heartbeat (the worker renews every third).
        max_attempts: How many times a task is claimed at most: a task that fails (or whose worker dies) on its
            last attempt ends ``FAILED``.
        retry_backoff: Seconds before the first retry; each later retry waits twice as long as the previous.
        retry_backoff_max: The longest wait between two attempts, in seconds.
        poll_interval: The longest an idle worker waits before looking for ready tasks again, in seconds (on
            PostgreSQL a ``NOTIFY`` sent when an enqueue commits wakes it sooner).
        notify: Whether enqueues on PostgreSQL send ``NOTIFY`` (on commit) to wake idle workers.
        task_modules: Modules (dotted names) outside ``INSTALLED_APPS`` whose tasks (and their submodules')
            may be enqueued and run; a task path in neither is refused before anything is imported.
        periodic: The periodic tasks the workers enqueue (``{name: {"task": path, "cron": expression}}``).
        id_function: Called without arguments for each enqueued task's id (a ``uuid.UUID`` or its text), as
            django-tasks' ``id_function``; ``None``: ``uuid.uuid4``.
    """

    database: str | None
    lease: float
    max_attempts: int
    retry_backoff: float
    retry_backoff_max: float
    poll_interval: float
    notify: bool
    task_modules: tuple[str, ...]
    periodic: tuple[schedules.Schedule, ...] = ()
    id_function: Callable[[], Any] | None = None

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before the attempt after ``attempt`` (1-based): exponential, capped."""
        return float(min(self.retry_backoff_max, self.retry_backoff * 2 ** max(0, attempt - 1)))


def parse(alias: str, options: object) -> TaskOptions:
    """Check a backend's ``OPTIONS`` and fill in the defaults.

    Args:
        alias: The backend's alias in ``settings.TASKS``, for the messages.
        options: The ``OPTIONS`` dict.

    Returns:
        The options.

    Raises:
        ImproperlyConfigured: ``OPTIONS`` is not a dict, names an unknown option, or an option has a wrong type
            or value, ``database`` an alias ``settings.DATABASES`` lacks and an ``id_function`` dotted path that
            does not import included (the message names ``TASKS[alias]["OPTIONS"][name]``, the value and what is
            accepted).
    """
    where = f'TASKS["{alias}"]["OPTIONS"]'
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict, not {type(options).__name__}")
    unknown = [name for name in options if name not in DEFAULTS]
    if unknown:
        named = sorted(_shown(name) for name in unknown)
        hints = "".join(
            f" ({_shown(name)}: did you mean {hint!r}?)" for name in unknown if (hint := _closest(name))
        )
        raise ImproperlyConfigured(
            f"{where} has unknown option(s) {', '.join(named)}{hints}; known: {', '.join(DEFAULTS)}"
        )
    values = {**DEFAULTS, **options}
    try:
        database = values["database"]
        if database is not None and (not isinstance(database, str) or not database):
            raise TypeError(f"database must be a database alias (a non-empty str) or None, not {database!r}")
        if database is not None and database not in settings.DATABASES:
            known = ", ".join(map(repr, settings.DATABASES))
            raise ValueError(f"database must be an alias of settings.DATABASES ({known}), got {database!r}")
        if not isinstance(values["notify"], bool):
            raise TypeError(f"notify must be True or False, not {type(values['notify']).__name__}")
        modules = values["task_modules"]
        if isinstance(modules, str) or not isinstance(modules, (list, tuple)):
            raise TypeError(f"task_modules must be a list of module names, not {type(modules).__name__}")
        for module in modules:
            if not isinstance(module, str) or not all(part.isidentifier() for part in module.split(".")):
                raise ValueError(f"task_modules must hold dotted module names, got {module!r}")
        parsed = TaskOptions(
            database=database,
            lease=duration(values["lease"], "lease"),
            max_attempts=positive_int(values["max_attempts"], "max_attempts"),
            retry_backoff=duration(values["retry_backoff"], "retry_backoff"),
            retry_backoff_max=duration(values["retry_backoff_max"], "retry_backoff_max"),
            poll_interval=duration(values["poll_interval"], "poll_interval"),
            notify=values["notify"],
            task_modules=tuple(modules),
            periodic=schedules.parse(values["periodic"]),
            id_function=_id_function(where, values["id_function"]),
        )
    except (TypeError, ValueError) as error:
        raise ImproperlyConfigured(f"{where}: {error}") from error
    if parsed.lease < 1:
        raise ImproperlyConfigured(f"{where}: lease must be at least 1 second, got {parsed.lease:g}")
    return parsed


def _id_function(where: str, value: object) -> Callable[[], Any] | None:
    """The ``id_function`` option: ``None``, a callable, or the dotted path of one (imported now)."""
    if value is None or callable(value):
        return value
    if not isinstance(value, str):
        raise TypeError(f"id_function must be a callable or its dotted path, not {type(value).__name__}")
    try:
        found = import_string(value)
    except ImportError as missing:
        # A setting's value that names nothing: the setting is wrong (ImproperlyConfigured, as Django says it),
        # with the import's own error kept as the cause.
        raise ImproperlyConfigured(f"{where}['id_function']: cannot import {value!r}: {missing}") from missing
    if not callable(found):
        raise TypeError(f"id_function {value!r} is a {type(found).__name__}, not a callable")
    return found  # type: ignore[no-any-return]


def _shown(name: object) -> str:
    """An unknown option's name as the error shows it: its ``repr``, cut short."""
    text = repr(name)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _closest(name: object) -> str | None:
    """The known option an unknown name most likely meant (``LEASE``, ``leese``: ``lease``), if any."""
    if not isinstance(name, str) or len(name) > 60:
        return None
    found = difflib.get_close_matches(name.lower(), DEFAULTS, n=1)
    return found[0] if found else None
