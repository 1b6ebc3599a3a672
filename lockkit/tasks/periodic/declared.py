"""``@periodic_task(cron)``: a schedule declared on the task, next to the ``periodic`` option's schedules.

The decorator records the schedule under the task's backend when the task's module is imported. A worker (and
``manage.py check``) imports each installed app's ``tasks`` module, as Celery's ``autodiscover_tasks()`` does, and
the modules of the backend's ``task_modules`` option, then fires the declared schedules with the option's ones.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any, TypeVar

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.tasks import task_backends
from django.tasks.base import Task
from django.utils.module_loading import autodiscover_modules

from lockkit.tasks import options
from lockkit.tasks.periodic import schedules

if TYPE_CHECKING:
    from lockkit.tasks.backend import DatabaseBackend

T = TypeVar("T", bound="Task[..., Any]")

#: The declared schedules, by backend alias, then by name, in the order their modules were imported.
_declared: dict[str, dict[str, schedules.Schedule]] = {}
#: The declarations on a task of a backend that is not lockkit's (not declared; reported by ``check``).
_ignored: list[str] = []


def periodic_task(
    cron: str,
    *,
    name: str | None = None,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    missed: str = "once",
    grace: float = 60.0,
) -> Callable[[T], T]:
    """Enqueue the decorated task on a cron schedule: the decorator form of the ``periodic`` option.

    Put it above ``@task``; the task is returned unchanged. Declare it in an installed app's ``tasks`` module, or
    in a module of the backend's ``task_modules`` option: workers import those when they start, then fire each
    tick once across all of them, as for a schedule of the option (docs/tasks.md, "Periodic tasks").

    Args:
        cron: Five fields (minute hour day-of-month month day-of-week), read in ``settings.TIME_ZONE``; six put
            seconds first.
        name: The schedule's name, its identity in the database (at most 100 characters); defaults to the task's
            dotted path.
        args: The positional arguments of each enqueue (JSON).
        kwargs: The keyword arguments of each enqueue (JSON).
        missed: ``"once"``: ticks no worker fired on time are enqueued late, as one task; ``"skip"``: a tick found
            more than ``grace`` seconds late is not enqueued.
        grace: With ``missed="skip"``, how many seconds late a tick may still be enqueued.

    Returns:
        The decorator.

    Raises:
        TypeError: ``cron`` is not a str (``@periodic_task`` written without its arguments); (from the decorator)
            it is not applied to a ``django.tasks`` ``Task``, or an argument has a wrong type (the message names
            it).
        ValueError: (from the decorator) a bad argument: a cron expression that does not parse or never fires,
            a ``missed`` other than ``"once"``/``"skip"``, a ``grace`` that is not a positive number of seconds,
            arguments that are not JSON; or another schedule of the task's backend was declared with the same
            name. cronsim (the ``periodic`` extra) not installed raises it too.

    Warns:
        RuntimeWarning: the task's backend is not a lockkit.tasks ``DatabaseBackend`` (a test's
            ``ImmediateBackend``, say): nothing is declared, the task is returned unchanged, and ``manage.py check``
            reports it (``lockkit.tasks.W002``).
    """
    if not isinstance(cron, str):
        what = f"the Task {cron.module_path}" if isinstance(cron, Task) else f"{type(cron).__name__} {cron!r}"
        raise TypeError(
            f'periodic_task() takes a cron expression first: write @periodic_task("*/5 * * * *") above @task '
            f"(got {what})"
        )

    def declare(task: T) -> T:
        if not isinstance(task, Task):
            qualname = getattr(task, "__qualname__", None)
            what = (
                f"the {type(task).__name__} {getattr(task, '__module__', '?')}.{qualname}"
                if qualname
                else repr(task)
            )
            raise TypeError(
                f"periodic_task() decorates a django.tasks Task (write @periodic_task(...) above @task), not {what}"
            )
        key = task.module_path if name is None else name
        runner = task.get_backend()
        # A lockkit.tasks DatabaseBackend (its class is not imported here: the backend imports this module).
        if not isinstance(getattr(runner, "settings", None), options.TaskOptions):
            # Not refused: a project's tests commonly swap TASKS for Django's ImmediateBackend or DummyBackend,
            # and the module must still import. Said at once, and by `manage.py check` (lockkit.tasks.W002).
            ignored = (
                f"@periodic_task on {task.module_path}: its backend {task.backend!r} "
                f"({type(runner).__name__}) is not a lockkit.tasks DatabaseBackend, so schedule {key!r} is not "
                f"declared and never fires"
            )
            if ignored not in _ignored:
                _ignored.append(ignored)
            warnings.warn(ignored, RuntimeWarning, stacklevel=2)
            return task
        spec = {
            "task": task.module_path,
            "cron": cron,
            # Not an iterable (or a str, bytes, dict): left for parse() to refuse, naming ['args'].
            "args": list(args)
            if isinstance(args, Iterable) and not isinstance(args, (str, bytes, Mapping))
            else args,
            "kwargs": {} if kwargs is None else kwargs,
            "missed": missed,
            "grace": grace,
        }
        try:
            (schedule,) = schedules.parse({key: spec})
        except (TypeError, ValueError) as bad:
            raise type(bad)(f"@periodic_task on {task.module_path}: {bad}") from bad
        known = _declared.setdefault(task.backend, {})
        if key in known and known[key] != schedule:
            raise ValueError(
                f"@periodic_task on {task.module_path}: backend {task.backend!r} already has a schedule named "
                f"{key!r} (for {known[key].task}); give this one another name="
            )
        known[key] = schedule
        return task

    return declare


def discover(backend: DatabaseBackend) -> None:
    """Import every installed app's ``tasks`` module and the backend's ``task_modules``: their declarations run.

    Raises:
        ImportError: one of those modules fails to import (as it would when its tasks run).
    """
    autodiscover_modules("tasks")
    for module in backend.settings.task_modules:
        try:
            import_module(module)
        except ImportError as missing:
            raise ImportError(
                f'TASKS["{backend.alias}"]["OPTIONS"]["task_modules"]: cannot import {module!r}: {missing}'
            ) from missing


def all_schedules(backend: DatabaseBackend) -> tuple[schedules.Schedule, ...]:
    """The backend's schedules: its ``periodic`` option's, then those declared with ``@periodic_task``.

    Raises:
        ImproperlyConfigured: a declared schedule has the name of one in the option (the message names both).
        ImportError: see ``discover``.
    """
    discover(backend)
    configured = backend.settings.periodic
    names = {schedule.name: schedule for schedule in configured}
    declared = tuple(_declared.get(backend.alias, {}).values())
    for schedule in declared:
        if schedule.name in names:
            raise ImproperlyConfigured(
                f'TASKS["{backend.alias}"]["OPTIONS"]["periodic"][{schedule.name!r}] (task '
                f"{names[schedule.name].task}) has the name of the schedule @periodic_task declares on "
                f"{schedule.task}: rename one (periodic_task(name=...))"
            )
    return configured + declared


def check(backend: DatabaseBackend) -> list[checks.CheckMessage]:
    """``lockkit.tasks.E002`` for each schedule whose task cannot be resolved (see ``schedules.resolve``).

    The schedules ``@periodic_task`` declares count (their modules are imported now); two schedules of one name,
    or a module of declarations that fails to import or whose declaration is refused, are one ``E002``.
    """
    found: list[checks.CheckMessage] = []
    try:
        every = all_schedules(backend)
    except (
        Exception
    ) as error:  # a module of declarations failed: its import error, or a declaration's refusal
        hint = "Give each schedule its own name." if isinstance(error, ImproperlyConfigured) else None
        named = isinstance(error, (ImproperlyConfigured, ImportError))  # their messages name the setting
        text = str(error) if named else f"{type(error).__name__}: {error}"
        return [checks.Error(text, hint=hint, id="lockkit.tasks.E002")]
    for schedule in every:
        try:
            schedules.resolve(schedule, backend)
        except ImproperlyConfigured as error:
            found.append(checks.Error(str(error), hint=_hint(str(error)), id="lockkit.tasks.E002"))
    found += [  # once, by the first lockkit.tasks backend of TASKS
        checks.Warning(
            text,
            hint="Declare it on a task of a lockkit.tasks backend (@task(backend=...)), or leave it: under a test's "
            "ImmediateBackend or DummyBackend nothing fires schedules anyway.",
            id="lockkit.tasks.W002",
        )
        for text in _ignored
        if backend.alias == _first_lockkit_alias()
    ]
    return found


def _first_lockkit_alias() -> str | None:
    """The first alias of ``TASKS`` whose backend is a lockkit.tasks ``DatabaseBackend``."""
    for alias in task_backends:  # TaskBackendHandler iterates over the aliases
        if isinstance(getattr(task_backends[alias], "settings", None), options.TaskOptions):
            return str(alias)
    return None


def _hint(error: str) -> str:
    """What to do about a schedule whose task cannot be resolved, by what ``schedules.resolve`` said."""
    if "cannot be called with" in error:
        return "Give the schedule the args and kwargs the task's function takes."
    return "Name a Task (a function decorated with @task) of this backend by its dotted path."
