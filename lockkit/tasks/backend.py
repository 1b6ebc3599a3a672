"""``DatabaseBackend``: Django 6's Tasks API on a lockkit.claims table (``enqueue``, ``get_result``, checks)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar, cast

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, DatabaseError, router
from django.db.models import CharField
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskResult, TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from lockkit._engine.liveness import discard_if_dead
from lockkit.errorcodes.table import code_of
from lockkit.tasks import arguments, enqueueing, options, results
from lockkit.tasks.periodic import declared

_P = ParamSpec("_P")
_R = TypeVar("_R")


class DatabaseBackend(BaseTaskBackend):
    """A Django Tasks backend storing tasks in a table that ``manage.py lockkit_worker`` claims and runs.

    Configure it in ``settings.TASKS`` (``{"default": {"BACKEND": "lockkit.tasks.DatabaseBackend", "QUEUES":
    [...], "OPTIONS": {"lease": 30, "max_attempts": 3}}}``) with ``"lockkit.tasks"`` in ``INSTALLED_APPS``.
    ``enqueue()`` inserts one row (inside the caller's ``atomic()`` when one is open: the task exists only if
    that transaction commits); workers claim rows with ``SKIP LOCKED`` under a lease and a fencing token
    (lockkit.claims), so a task runs on one worker at a time, a dead worker's task is taken again when its
    lease ends, and a stale worker cannot overwrite a newer result. See docs/tasks.md and
    https://docs.djangoproject.com/en/6.0/topics/tasks/.

    Attributes:
        settings (lockkit.tasks.options.TaskOptions): The checked ``OPTIONS`` (``lease``, ``max_attempts``,
            ``retry_backoff``, ``retry_backoff_max``, ``poll_interval``, ``database``, ``notify``,
            ``task_modules``, ``periodic``, ``id_function``).

    Raises:
        django.core.exceptions.ImproperlyConfigured: when built, ``OPTIONS`` has an unknown option or a bad
            value, an ``id_function`` dotted path that does not import included (the message names it).
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        """Read ``QUEUES`` and check ``OPTIONS``.

        Raises:
            django.core.exceptions.ImproperlyConfigured: a bad option; the alias or a queue name is longer than
                its column of the task table (32 characters).
        """
        super().__init__(alias, params)
        self.settings = options.parse(alias, self.options)
        longest = _column_length("backend_name")
        if len(alias) > longest:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]: a lockkit.tasks backend's alias is at most {longest} characters (the task "
                f"table's backend_name column), got {len(alias)}"
            )
        longest = _column_length("queue_name")
        too_long = sorted(queue for queue in self.queues if len(queue) > longest)
        if too_long:
            raise ImproperlyConfigured(
                f'TASKS[{alias!r}]["QUEUES"]: queue names are at most {longest} characters (the task table\'s '
                f"queue_name column), got {', '.join(map(repr, too_long))}"
            )

    def database(self) -> str:
        """The alias of the task table: ``OPTIONS["database"]``, else ``router.db_for_write`` of the model."""
        if self.settings.database is not None:
            return self.settings.database
        from lockkit.tasks.models import QueuedTask

        return router.db_for_write(QueuedTask)

    def enqueue(self, task: Task[_P, _R], args: list[Any], kwargs: dict[str, Any]) -> TaskResult[_P, _R]:
        """Store a task to be run by a worker; the arguments are checked before any SQL.

        One statement (on PostgreSQL the ``INSERT`` and the ``NOTIFY`` that wakes idle workers together). Inside
        an open ``atomic()`` on the task table's alias, the row commits or rolls back with the caller's
        transaction. When the task table is on another alias (``OPTIONS["database"]``) and the caller's
        transaction is open on its own alias (a ``locked()`` scope's, or the one alias with an ``atomic()``
        open), the insert runs when that transaction commits (``on_commit``), and never after a rollback or for
        a retried attempt; the returned result's row exists from then on.

        Args:
            task: The ``Task`` (its ``priority``, ``queue_name`` and ``run_after`` are stored).
            args: Positional arguments, JSON (lists, dicts with string keys, str, int, float, bool, None).
            kwargs: Keyword arguments, JSON.

        Returns:
            The ``TaskResult``, ``READY``.

        Raises:
            django.core.exceptions.ImproperlyConfigured: ``"lockkit.tasks"`` is not in ``INSTALLED_APPS``
                (the task table would not exist); nothing is written.
            django.tasks.exceptions.InvalidTask: the task is not valid for this backend (queue, priority,
                ``run_after`` not aware...).
            TypeError, ValueError: an argument is not JSON (see ``lockkit.tasks.arguments.json_value``).
            django.core.exceptions.ImproperlyConfigured: ``OPTIONS["id_function"]`` returned something other
                than a UUID or its text (a database expression such as ``RandomUUID`` included); nothing is
                written.
            django.db.transaction.TransactionManagementError: the task table is on another alias and
                transactions are open on several aliases, none of them a lockkit scope's (which one the task
                belongs to is unknown); nothing is written.
        """
        _require_app(self.alias)
        self._validate_once(task)
        row = self._row(task, args, kwargs)
        alias = self.database()
        # Outside a transaction, a connection an earlier call left dead (a MariaDB "packet too big" closes it)
        # is replaced: one failed enqueue does not make every later one in the process fail.
        discard_if_dead(alias)
        result = cast("TaskResult[_P, _R]", results.result_of(row, task))
        notify = task.queue_name if self.settings.notify else None
        try:
            enqueueing.write(row, alias, notify, lambda: task_enqueued.send(type(self), task_result=result))
        except DatabaseError as error:
            if _no_table(error):
                from lockkit.tasks.models import QueuedTask

                error.add_note(
                    f"lockkit.tasks: the task table {QueuedTask._meta.db_table} does not exist on database "
                    f"{alias!r}: run `manage.py migrate --database {alias}`"
                )
            raise
        return result

    def validate_task(self, task: Task[..., Any]) -> None:
        """Django's checks, plus: the task is bound to this backend, and its path is one a worker imports.

        The path must pass ``lockkit.tasks.results.check_task_path`` (an installed app's, or ``task_modules``).

        Raises:
            django.tasks.exceptions.InvalidTask: the task is not valid for this backend, is another backend's
                (its result could not be read back through ``task.get_result()`` or ``refresh()``), or its
                module is in no installed app nor in ``OPTIONS["task_modules"]``, or its queue name is longer
                than the task table's column (32 characters), or its ``run_after`` is not an aware
                ``datetime`` (a ``timedelta`` included: the message shows the delay's form).
        """
        run_after: object = task.run_after
        if run_after is not None and not isinstance(run_after, datetime):
            hint = (
                ": for a delay, use task.using(run_after=timezone.now() + timedelta(...))"
                if isinstance(run_after, timedelta)
                else ""
            )
            raise InvalidTask(f"run_after must be an aware datetime, not {type(run_after).__name__}{hint}")
        super().validate_task(task)
        results.check_task_path(task.module_path, self.settings.task_modules)
        longest = _column_length("queue_name")
        if len(task.queue_name) > longest:  # any queue is allowed when QUEUES is empty
            raise InvalidTask(f"queue_name must be at most {longest} characters, got {task.queue_name!r}")
        if task.backend != self.alias:
            raise InvalidTask(
                f"Task {task.module_path!r} uses backend {task.backend!r}, not {self.alias!r}: enqueue it with "
                f"task.using(backend={self.alias!r}).enqueue()"
            )

    def _validate_once(self, task: Task[..., Any]) -> None:
        """``validate_task(task)``, remembered per backend and task until a setting changes (``INSTALLED_APPS``)."""
        key = (self, task)
        if key in _VALIDATED:
            return
        generation = _GENERATION[0]
        self.validate_task(task)
        if generation != _GENERATION[0]:
            return  # a setting changed while it was checked (another thread): not remembered
        if len(_VALIDATED) >= _VALIDATED_KEPT:
            _VALIDATED.clear()
        _VALIDATED[key] = None

    def _row(self, task: Task[..., Any], args: Any, kwargs: Any) -> Any:
        from lockkit.tasks.models import QueuedTask

        stored = {
            "args": arguments.json_value(list(args), "args"),
            "kwargs": arguments.json_value(dict(kwargs), "kwargs"),
        }
        return QueuedTask(
            id=self._new_id(),
            backend_name=self.alias,
            queue_name=task.queue_name,
            priority=task.priority,
            task_path=task.module_path,
            takes_context=task.takes_context,
            args_kwargs=stored,
            status=TaskResultStatus.READY,
            run_after=task.run_after,
            ready_at=task.run_after,
            enqueued_at=timezone.now(),
        )

    def _new_id(self) -> uuid.UUID:
        """A new task's id: ``OPTIONS["id_function"]()``, checked, else ``uuid.uuid4()``."""
        make = self.settings.id_function
        if make is None:
            return uuid.uuid4()
        value = make()
        if isinstance(value, uuid.UUID):
            return value
        try:
            if isinstance(value, str):
                return uuid.UUID(value)
        except ValueError:
            pass
        raise ImproperlyConfigured(
            f'TASKS["{self.alias}"]["OPTIONS"]["id_function"] must return a uuid.UUID or its text, got {value!r}'
            + (
                " (a database expression: lockkit's enqueue sends a statement of its own, with the id as a value)"
                if hasattr(value, "resolve_expression")
                else ""
            )
        )

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """Read a task's result (its status, return value, errors and workers) from the database.

        Args:
            result_id: The ``TaskResult.id``.

        Returns:
            The ``TaskResult``.

        Raises:
            django.core.exceptions.ImproperlyConfigured: ``"lockkit.tasks"`` is not in ``INSTALLED_APPS``.
            django.tasks.exceptions.TaskResultDoesNotExist: no task of this id for this backend (another
                backend's task in the same table), or an id that is not a UUID.
            django.tasks.exceptions.InvalidTask: the row's ``task_path`` is refused (``check_task_path``),
                before anything is imported.
            ImportError: the row's ``task_path`` does not import any more.
            TypeError: the row's ``args_kwargs`` is not ``{"args": [...], "kwargs": {...}}`` (edited by hand).
        """
        _require_app(self.alias)
        from lockkit.tasks.models import QueuedTask

        alias = self.database()
        discard_if_dead(alias)
        try:
            row = QueuedTask.objects.using(alias).get(pk=result_id, backend_name=self.alias)
        except (QueuedTask.DoesNotExist, ValidationError, TypeError, ValueError) as missing:
            raise TaskResultDoesNotExist(result_id) from missing
        return results.result_of(row)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's checks, plus ``lockkit.tasks.E001`` (no app), ``W001`` (another alias), periodic tasks' errors.

        ``lockkit.tasks.W001``: the task table is not on ``default``, where callers' transactions usually are;
        an ``enqueue()`` in a transaction on another alias is written when that transaction commits.
        """
        found: list[checks.CheckMessage] = list(super().check(**kwargs))
        found += declared.check(self)
        alias = self.settings.database
        if alias is not None and alias != DEFAULT_DB_ALIAS:
            found.append(
                checks.Warning(
                    f"TASKS[{self.alias!r}] keeps its task table on database {alias!r}, not {DEFAULT_DB_ALIAS!r}: "
                    f"there is no transaction across the two",
                    hint=(
                        f"An enqueue() inside a transaction on another alias is written only when that "
                        f"transaction commits (on_commit); inside atomic(using={alias!r}) it joins the task "
                        f"table's transaction. See 'Where the task table lives' in lockkit's tasks docs; "
                        f"silence with SILENCED_SYSTEM_CHECKS once that is what you want."
                    ),
                    id="lockkit.tasks.W001",
                )
            )
        if not apps.is_installed("lockkit.tasks"):
            found.append(
                checks.Error(
                    f"{type(self).__name__} is configured in TASKS[{self.alias!r}] but its app is not installed",
                    hint='Add "lockkit.tasks" to INSTALLED_APPS and run migrate.',
                    id="lockkit.tasks.E001",
                )
            )
        return found


def task_database() -> str:
    """The alias the admin reads the task table (and the periodic schedules) on.

    When the ``lockkit.tasks`` backends of ``settings.TASKS`` keep the table on one alias (``OPTIONS["database"]``),
    that one, as Django's multiple-database admin does
    (https://docs.djangoproject.com/en/stable/topics/db/multi-db/#exposing-multiple-databases-in-django-s-admin-interface);
    else what the routers say (``router.db_for_write`` of the task model).

    Returns:
        The database alias.
    """
    from django.tasks import task_backends

    from lockkit.tasks.models import QueuedTask

    aliases = {backend.database() for backend in task_backends.all() if isinstance(backend, DatabaseBackend)}
    if len(aliases) == 1:
        return aliases.pop()
    return router.db_for_write(QueuedTask)


#: The (backend, task) pairs that passed ``validate_task``: a ``Task`` is frozen, and what else the checks read
#: (``INSTALLED_APPS``, ``USE_TZ``, ``TASKS``) are settings, so any ``setting_changed`` forgets them all.
_VALIDATED: dict[tuple[DatabaseBackend, Task[..., Any]], None] = {}
_VALIDATED_KEPT = 1024
_GENERATION = [0]  # bumped by each setting change


def _forget_validated(**kwargs: Any) -> None:
    _GENERATION[0] += 1
    _VALIDATED.clear()


setting_changed.connect(_forget_validated, dispatch_uid="lockkit.tasks.backend.forget_validated")


def _require_app(alias: str) -> None:
    """Raise ``ImproperlyConfigured`` unless ``lockkit.tasks`` is installed (``lockkit.tasks.E001`` at runtime)."""
    if not apps.is_installed("lockkit.tasks"):
        raise ImproperlyConfigured(
            f'TASKS["{alias}"] is a lockkit.tasks backend but "lockkit.tasks" is not in INSTALLED_APPS: add it '
            f"and run migrate (the task table is its)"
        )


#: The codes of "no such table": PostgreSQL's SQLSTATE, MariaDB/MySQL's error number.
_NO_TABLE_CODES = frozenset({"42P01", "1146"})


def _no_table(error: DatabaseError) -> bool:
    """Whether ``error`` says a table does not exist (SQLite's error carries no code: its message says so)."""
    return code_of(error) in _NO_TABLE_CODES or str(error).startswith("no such table:")


def _column_length(field: str) -> int:
    """The ``max_length`` of a ``QueuedTask`` text column (the model is imported lazily: settings build backends)."""
    from lockkit.tasks.models import QueuedTask

    column = QueuedTask._meta.get_field(field)
    assert isinstance(column, CharField)
    assert column.max_length is not None
    return int(column.max_length)


def backend_named(name: str, label: str) -> DatabaseBackend:
    """The ``DatabaseBackend`` that ``settings.TASKS[name]`` configures, for a command's option or an argument.

    Args:
        name: An alias of ``settings.TASKS``.
        label: How the caller names it in an error (``"--backend 'default'"``, ``"task_backends: 'default'"``).

    Raises:
        ValueError: ``name`` is not an alias of ``settings.TASKS`` (the message lists them), its backend cannot
            be built, or it is another kind of backend; the message begins with ``label``.
    """
    from django.conf import settings
    from django.tasks import task_backends
    from django.tasks.exceptions import InvalidTaskBackend

    aliases = list(getattr(settings, "TASKS", {}) or {})
    if name not in aliases:
        raise ValueError(
            f"{label} is not an alias of settings.TASKS ({', '.join(map(repr, aliases)) or 'none'})"
        )
    try:
        backend = task_backends[name]
    except InvalidTaskBackend as error:
        raise ValueError(f"{label}: {error}") from error
    if not isinstance(backend, DatabaseBackend):
        kind = type(backend)
        raise ValueError(
            f"{label} is {kind.__module__}.{kind.__qualname__}, not lockkit.tasks.DatabaseBackend"
        )
    return backend
