"""The ``periodic`` option of a ``DatabaseBackend``: each schedule checked once, and its ticks by the cron string."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.tasks.base import Task
from django.tasks.exceptions import InvalidTask
from django.utils import timezone
from django.utils.module_loading import import_string

from lockkit.tasks import arguments

if TYPE_CHECKING:
    from lockkit.tasks.backend import DatabaseBackend

#: What a schedule may say, and the default of each optional key.
KEYS: dict[str, Any] = {"task": None, "cron": None, "args": [], "kwargs": {}, "missed": "once", "grace": 60.0}
#: ``missed``: a tick found late (no worker ran at its time) is still fired, once for all of them; or skipped.
MISSED = ("once", "skip")
#: The longest schedule name (the ``PeriodicSchedule.name`` column).
NAME_MAX_LENGTH = 100
#: The longest task path and cron expression (their columns).
TEXT_MAX_LENGTH = 255


@dataclass(frozen=True)
class Schedule:
    """One periodic task, checked.

    Attributes:
        name: The schedule's name (its key in ``periodic``): its identity in the database.
        task: The dotted path of the ``Task`` to enqueue.
        cron: The cron expression: 5 fields (minute hour day month weekday), or 6 with seconds first. It is read
            in ``settings.TIME_ZONE``.
        args: The positional arguments of each enqueue (JSON).
        kwargs: The keyword arguments of each enqueue (JSON).
        missed: ``"once"``: the ticks no worker fired on time are fired late, as one task (for the latest);
            ``"skip"``: a tick found more than ``grace`` seconds late is not fired.
        grace: Seconds after its time a tick still counts as on time (with ``missed="skip"``).
    """

    name: str
    task: str
    cron: str
    args: list[Any]
    kwargs: dict[str, Any]
    missed: str
    grace: float

    def latest(self, now: datetime) -> datetime | None:
        """The latest tick at or before ``now`` (``None`` if none in the last 50 years)."""
        return _tick(self.cron, now.replace(microsecond=0) + timedelta(seconds=1), reverse=True)

    def after(self, moment: datetime) -> datetime | None:
        """The first tick strictly after ``moment`` (``None`` if none in the next 50 years)."""
        return _tick(self.cron, moment, reverse=False)


def _tick(cron: str, moment: datetime, *, reverse: bool) -> datetime | None:
    from cronsim import CronSim  # the ``periodic`` extra; parse() said so if it is missing

    # Read in TIME_ZONE's wall clock (USE_TZ = False: naive, already in it); an aware tick is returned in UTC, so
    # ticks compare by instant: the repeated hour of an autumn DST change is two ticks, which compare equal as
    # wall-clock times in one zone (``fold`` is ignored there). TIME_ZONE's zone, never the thread's active one
    # (``localtime()``'s default): a task that called ``timezone.activate()`` leaves its zone on the worker's thread.
    zone = timezone.get_default_timezone()  # zoneinfo.ZoneInfo(settings.TIME_ZONE)
    start = moment.astimezone(zone) if timezone.is_aware(moment) else moment
    try:
        found = next(CronSim(cron, start, reverse=reverse))
    except StopIteration:
        return None
    return found.astimezone(UTC) if timezone.is_aware(found) else found


def parse(value: object) -> tuple[Schedule, ...]:
    """Check the ``periodic`` option: ``{name: {"task": path, "cron": expression, ...}}``.

    Args:
        value: The option's value.

    Returns:
        The schedules, in the order given.

    Raises:
        TypeError, ValueError: a bad schedule; the message names it as ``periodic["name"]["key"]``. Also when
            schedules are given and cronsim (the ``periodic`` extra) is not installed.
    """
    if not isinstance(value, Mapping):
        raise TypeError(f"periodic must be a dict of schedules by name, not {type(value).__name__}")
    if not value:
        return ()
    try:
        from cronsim import CronSim, CronSimError
    except ImportError as missing:
        raise ValueError(
            "periodic schedules need cronsim (lockkit's 'periodic' extra): pip install 'cronsim>=2.7'"
        ) from missing
    found = []
    for name, spec in value.items():
        where = f"periodic[{name!r}]"
        if not isinstance(name, str) or not 0 < len(name) <= NAME_MAX_LENGTH:
            raise ValueError(f"{where}: a schedule's name must be a str of 1 to {NAME_MAX_LENGTH} characters")
        if "\x00" in name or not _unicode(name):
            # Its row could not be written: every schedule's row is created in one statement, so none would fire.
            raise ValueError(f"{where}: a schedule's name must not hold a NUL character or a lone surrogate")
        if not isinstance(spec, Mapping):
            raise TypeError(f"{where} must be a dict with 'task' and 'cron', not {type(spec).__name__}")
        unknown = sorted(str(key) for key in spec if key not in KEYS)
        if unknown:
            raise ValueError(
                f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(KEYS)}"
            )
        values = {**KEYS, **spec}
        task, cron, missed, grace = values["task"], values["cron"], values["missed"], values["grace"]
        if not isinstance(task, str) or "." not in task or len(task) > TEXT_MAX_LENGTH:
            raise ValueError(
                f"{where}['task'] must be the dotted path of a Task (at most {TEXT_MAX_LENGTH} characters), got {task!r}"
            )
        if not isinstance(cron, str) or len(cron) > TEXT_MAX_LENGTH:
            raise TypeError(
                f"{where}['cron'] must be a cron expression (a str of at most {TEXT_MAX_LENGTH} characters), got {cron!r}"
            )
        shortcut = cron.strip().lower()
        if shortcut.startswith("@"):
            # cronsim reads them as a wrong number of fields, which does not tell a crontab user what to write.
            instead = _SHORTCUTS.get(shortcut)
            raise ValueError(
                f"{where}['cron'] {cron!r}: cron's @ shortcuts are not read: "
                + (f"write the five fields {instead!r}" if instead else "write the five fields")
                + " (minute hour day-of-month month day-of-week)"
            )
        try:
            next(CronSim(cron, timezone.now()))
        except (CronSimError, StopIteration) as bad:
            raise ValueError(
                f"{where}['cron'] is not a cron expression that fires: {cron!r} ({bad or 'never fires'}); five "
                f"fields (minute hour day month weekday), or six with seconds first"
            ) from bad
        too_long = _step_past_range(cron)
        if too_long is not None:
            step, (field, low, high) = too_long
            order = "six fields put seconds first: " if len(cron.split()) == 6 else "five fields: "
            raise ValueError(
                f"{where}['cron'] {cron!r}: the step {step} in the {field} field is longer than the field's range "
                f"({low}-{high}), so it matches only its first value: write that value instead ({order}"
                f"{' '.join(name for name, _, _ in _FIELDS[len(_FIELDS) - len(cron.split()) :])})"
            )
        if missed not in MISSED:
            raise ValueError(
                f"{where}['missed'] must be one of {', '.join(map(repr, MISSED))}, got {missed!r}"
            )
        if (
            isinstance(grace, bool)
            or not isinstance(grace, (int, float))
            or not (grace > 0 and math.isfinite(grace))
        ):
            raise ValueError(f"{where}['grace'] must be a positive number of seconds, got {grace!r}")
        if not isinstance(values["args"], (list, tuple)):
            raise TypeError(f"{where}['args'] must be a list, not {type(values['args']).__name__}")
        if not isinstance(values["kwargs"], Mapping):
            raise TypeError(f"{where}['kwargs'] must be a dict, not {type(values['kwargs']).__name__}")
        found.append(
            Schedule(
                name=name,
                task=task,
                cron=cron,
                args=arguments.json_value(list(values["args"]), f"{where}['args']"),
                kwargs=arguments.json_value(dict(values["kwargs"]), f"{where}['kwargs']"),
                missed=missed,
                grace=float(grace),
            )
        )
    return tuple(found)


#: The five fields each of cron's @ shortcuts stands for (``@reboot`` has none), named in the refusal of one.
_SHORTCUTS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

#: Each field's name and range, seconds first (a five-field expression has no seconds field).
_FIELDS = (
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 6),
)


def _step_past_range(cron: str) -> tuple[str, tuple[str, int, int]] | None:
    """The first ``*/N`` or ``A-B/N`` step longer than its field's range, with that field, or ``None``.

    cronsim accepts one (``*/90`` among the seconds is second 0 only); a reader expects what it says.
    """
    fields = cron.split()
    named = _FIELDS if len(fields) == 6 else _FIELDS[1:]
    for field, (name, low, high) in zip(fields, named, strict=False):
        for part in field.split(","):
            _, slash, step = part.partition("/")
            if slash and step.isdigit() and int(step) > high - low:
                return part, (name, low, high)
    return None


def _unicode(text: str) -> bool:
    """Whether ``text`` is Unicode text (no lone surrogate): what PostgreSQL and MariaDB store."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def resolve(schedule: Schedule, backend: DatabaseBackend) -> Task[..., Any]:
    """The schedule's ``Task``, checked against ``backend`` (imported now: done at worker start and by checks).

    Raises:
        ImproperlyConfigured: the path does not import, is not a ``Task``, the task is not valid for this
            backend (another backend's, a queue it lacks...), or its function cannot take the schedule's ``args``
            and ``kwargs``; the message names the setting.
    """
    where = f'TASKS["{backend.alias}"]["OPTIONS"]["periodic"][{schedule.name!r}]["task"]'
    try:
        task = import_string(schedule.task)
    except ImportError as missing:
        raise ImproperlyConfigured(f"{where}: cannot import {schedule.task!r}: {missing}") from missing
    if not isinstance(task, Task):
        raise ImproperlyConfigured(
            f"{where}: {schedule.task!r} is a {type(task).__name__}, not a django.tasks Task"
        )
    try:
        backend.validate_task(task)
    except InvalidTask as invalid:
        raise ImproperlyConfigured(f"{where}: {invalid}") from invalid
    context = [None] if task.takes_context else []  # the TaskContext a worker passes first
    try:
        inspect.signature(task.func).bind(*context, *schedule.args, **schedule.kwargs)
    except TypeError as unbound:
        raise ImproperlyConfigured(
            f"{where}: {schedule.task} cannot be called with the schedule's args {schedule.args!r} and kwargs "
            f"{schedule.kwargs!r}: {unbound}"
        ) from unbound
    return task
