"""Periodic tasks: each tick fired once by any number of worker processes, across restarts; missed ticks; bad input.

The schedules tick every few seconds (six-field cron, seconds first) so that a test sees several ticks; minute
granularity is the normal use. The tick of each enqueued task is its ``run_after``.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any
from unittest import mock

import pytest
from django.contrib.admin.sites import AdminSite
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.tasks import task_backends
from django.tasks.signals import task_enqueued
from django.test import override_settings
from django.test.client import RequestFactory
from django.utils import timezone

from lockkit.tasks import DatabaseBackend
from lockkit.tasks.models import PeriodicSchedule, QueuedTask
from lockkit.tasks.periodic.admin import PeriodicScheduleAdmin
from lockkit.tasks.periodic.firing import RETRY_AFTER, Periodic
from lockkit.tasks.worker import Worker
from lockkit_tests.support.faultkit import ended_at_first_statement
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON
from lockkit_tests.tasks.helpers import APPS, backend_on, run_worker, tasks_setting, wait_for, worker_process

TASK = "lockkit_tests.tasks.jobs.noop_task"


def _mark(*databases: str) -> Any:
    return pytest.mark.django_db(transaction=True, databases=list(databases), available_apps=APPS)


VENDORS = [
    pytest.param("default", id="postgresql", marks=_mark("default")),
    pytest.param(
        "mariadb",
        id="mariadb",
        marks=[_mark("default", "mariadb")]
        if MYSQL_CONFIGURED
        else [pytest.mark.skip(reason=MYSQL_SKIP_REASON)],
    ),
]


def every(seconds: int, **extra: Any) -> dict[str, Any]:
    """``periodic`` with one schedule, ``tick``, of ``noop_task`` every ``seconds`` seconds."""
    return {"tick": {"task": TASK, "cron": f"*/{seconds} * * * * *", **extra}}


def fired(alias: str) -> list[datetime]:
    """The tick of every periodic task enqueued, in order (duplicates kept)."""
    rows = QueuedTask.objects.using(alias).filter(task_path=TASK)
    return sorted(tick for tick in rows.values_list("run_after", flat=True) if tick is not None)


def assert_each_tick_once(ticks: list[datetime], seconds: int) -> None:
    """No tick twice, none missing between the first and the last."""
    assert len(ticks) == len(set(ticks)), (
        f"ticks fired twice: {sorted(t for t in ticks if ticks.count(t) > 1)}"
    )
    expected = [ticks[0] + timedelta(seconds=seconds * n) for n in range(len(ticks))]
    assert ticks == expected, f"missing ticks: {sorted(set(expected) - set(ticks))}"


def latest_tick(moment: datetime, seconds: int) -> datetime:
    """The latest tick of ``*/seconds`` at or before ``moment`` (UTC: the seconds divisible by ``seconds``)."""
    moment = moment.replace(microsecond=0)
    return moment - timedelta(seconds=moment.second % seconds)


def stop_all(workers: list[Any]) -> None:
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        code, output = worker.wait(timeout=30)
        assert code == 0, output


@pytest.mark.parametrize("alias", VENDORS)
def test_three_workers_fire_each_tick_exactly_once(alias: str) -> None:
    options = {"periodic": every(2)}
    with ExitStack() as stack:
        workers = [
            stack.enter_context(worker_process(alias, "--worker-id", f"w{n}", options=options))
            for n in range(3)
        ]
        wait_for(lambda: len(fired(alias)) >= 6, timeout=90, what="six ticks")
        stop_all(workers)
    ticks = fired(alias)
    assert len(ticks) >= 6
    assert_each_tick_once(ticks, 2)
    row = PeriodicSchedule.objects.using(alias).get()
    assert (row.name, row.last_tick, row.last_action) == ("tick", ticks[-1], "fired")
    assert row.next_tick == ticks[-1] + timedelta(seconds=2)


@pytest.mark.parametrize("alias", VENDORS)
def test_a_worker_started_with_no_periodic_fires_no_tick_and_another_worker_fires_it(alias: str) -> None:
    """``lockkit_worker --no-periodic`` only runs tasks: with a tick due it enqueues nothing and leaves the schedule's
    row alone; a worker without the option, run afterwards, fires that tick."""
    with backend_on(alias, periodic=every(1)) as backend:
        run_worker(backend)  # the schedule's row: ticks fire from now on
        row = PeriodicSchedule.objects.using(alias).get()
        assert (fired(alias), row.last_tick) == ([], None)
        wait_for(
            lambda: timezone.now() > row.created_at + timedelta(seconds=1.2), timeout=5, what="a tick due"
        )
        call_command("lockkit_worker", "--burst", "--no-periodic", stdout=StringIO(), stderr=StringIO())
        assert (fired(alias), PeriodicSchedule.objects.using(alias).get().last_tick) == ([], None)
        run_worker(backend)
        ticks = fired(alias)
        assert ticks, "the worker without --no-periodic fired nothing"
        assert_each_tick_once(ticks, 1)  # a tick coming due during its run may follow the late one
        assert PeriodicSchedule.objects.using(alias).get().last_tick == ticks[-1]
        with pytest.raises(TypeError, match="periodic must be True or False"):
            Worker(backend, queues=sorted(backend.queues), periodic="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("alias", VENDORS)
def test_a_restart_of_all_workers_neither_repeats_nor_loses_a_tick(alias: str) -> None:
    # The restarted workers must fire the missed tick before the next one is due: a period of 10 s leaves their
    # start almost 10 s (6 s was too little for three worker processes on a loaded machine).
    seconds = 10
    options = {"periodic": every(seconds)}
    with ExitStack() as stack:
        workers = [stack.enter_context(worker_process(alias, options=options)) for _ in range(3)]
        wait_for(lambda: len(fired(alias)) >= 2, timeout=90, what="two ticks")
        stop_all(workers)
    before = fired(alias)
    # The next tick passes while no worker runs: the workers started after it fire it, late, once.
    missed = before[-1] + timedelta(seconds=seconds)
    wait_for(
        lambda: timezone.now() > missed + timedelta(seconds=0.2), timeout=3 * seconds, what="a missed tick"
    )
    with ExitStack() as stack:
        workers = [stack.enter_context(worker_process(alias, options=options)) for _ in range(3)]
        wait_for(lambda: len(fired(alias)) >= len(before) + 2, timeout=90, what="two more ticks")
        stop_all(workers)
    ticks = fired(alias)
    assert missed in ticks
    assert_each_tick_once(ticks, seconds)


@pytest.mark.parametrize("alias", VENDORS)
def test_an_idle_worker_fires_every_tick_however_long_its_poll_interval(alias: str) -> None:
    """An idle worker wakes for the next tick, not only for a task or after ``poll_interval``. Before, with
    ``poll_interval`` longer than the schedule's period it fired one tick per ``poll_interval`` (the latest), and
    the ticks between were neither fired nor recorded as skipped."""
    options = {"poll_interval": 60, "periodic": every(2, missed="skip")}
    with worker_process(alias, options=options) as worker:
        # Four ticks take 8 s (and the worker's start); the worker first wakes by poll_interval 60 s after it starts.
        wait_for(lambda: len(fired(alias)) >= 4, timeout=40, what="four ticks well within poll_interval")
        stop_all([worker])
    ticks = fired(alias)
    assert_each_tick_once(ticks, 2)
    row = PeriodicSchedule.objects.using(alias).get()
    assert (row.last_tick, row.last_action) == (ticks[-1], "fired")


@pytest.mark.parametrize(
    "alias", [*VENDORS, pytest.param("sqlite", id="sqlite", marks=_mark("default", "sqlite"))]
)
@pytest.mark.parametrize(
    ("missed", "grace", "fires"),
    [("once", 0.05, True), ("skip", 0.05, False), ("skip", 60, True)],
    ids=["once", "skip-late", "skip-within-grace"],
)
def test_ticks_missed_while_no_worker_ran_fire_once_or_are_skipped(
    alias: str, missed: str, grace: float, fires: bool
) -> None:
    seconds = 2
    with backend_on(alias, periodic=every(seconds, missed=missed, grace=grace)) as backend:
        run_worker(backend)  # the schedule's row: ticks fire from now on
        assert fired(alias) == []
        created = PeriodicSchedule.objects.using(alias).get().created_at
        # Three ticks or more pass with no worker running; the worker starts away from a tick (0.3-1.5 s after one),
        # so the latest tick is late by more than the 0.05 s grace whenever the worker looks.
        wait_for(
            lambda: (
                timezone.now() > created + timedelta(seconds=3 * seconds + 0.2)
                and timedelta(seconds=0.3)
                <= timezone.now() - latest_tick(timezone.now(), seconds)
                <= timedelta(seconds=1.5)
            ),
            timeout=20,
            what="missed ticks, away from a tick",
        )
        started = timezone.now()
        run_worker(backend)
    latest = latest_tick(started, seconds)
    ticks = fired(alias)
    row = PeriodicSchedule.objects.using(alias).get()
    assert row.last_tick is not None
    assert row.last_tick >= latest
    if fires:
        # One task for all the missed ticks: the latest (a tick coming due during the run may follow it).
        assert ticks, "no task for the missed ticks"
        assert ticks[0] == latest, (ticks, latest)
        assert_each_tick_once(ticks, seconds)
    else:
        # Skipped: every tick more than `grace` late when the worker looked (at `started` or later). Only a tick
        # coming due during the run may fire.
        assert latest < started - timedelta(seconds=grace)
        assert [tick for tick in ticks if tick <= latest] == []
        if row.last_tick == latest:
            assert row.last_action == "skipped"


@pytest.mark.parametrize(
    ("periodic", "named"),
    [
        ({"t": {"task": TASK, "cron": "61 * * * *"}}, "periodic['t']['cron']"),
        ({"t": {"task": TASK, "cron": "* * *"}}, "periodic['t']['cron']"),
        (
            {"t": {"task": TASK, "cron": "*/90 * * * * *"}},
            "step",
        ),  # a hostile review: accepted, once a minute
        ({"t": {"task": TASK, "cron": "0 */24 * * *"}}, "step"),
        ({"t": {"task": TASK, "cron": "0 0 30 2 *"}}, "periodic['t']['cron']"),
        ({"t": {"task": TASK, "cron": 5}}, "periodic['t']['cron']"),
        ({"t": {"task": TASK, "cron": "* * * * *", "missed": "all"}}, "periodic['t']['missed']"),
        ({"t": {"task": TASK, "cron": "* * * * *", "grace": 0}}, "periodic['t']['grace']"),
        ({"t": {"task": TASK, "cron": "* * * * *", "args": "x"}}, "periodic['t']['args']"),
        ({"t": {"task": TASK, "cron": "* * * * *", "kwargs": {"a": {1, 2}}}}, "periodic['t']['kwargs']"),
        ({"t": {"task": TASK, "cron": "* * * * *", "every": 5}}, "'every'"),
        ({"t": {"cron": "* * * * *"}}, "periodic['t']['task']"),
        ({"t": {"task": "a." + "b" * 255, "cron": "* * * * *"}}, "periodic['t']['task']"),
        ({"x" * 101: {"task": TASK, "cron": "* * * * *"}}, "a schedule's name"),
        ({"t": "* * * * *"}, "periodic['t']"),
        ({"": {"task": TASK, "cron": "* * * * *"}}, "periodic['']"),
        ([], "periodic must be a dict"),
    ],
)
def test_a_bad_schedule_is_refused_when_the_backend_is_built(periodic: Any, named: str) -> None:
    with override_settings(TASKS=tasks_setting("default", periodic=periodic)):
        with pytest.raises(ImproperlyConfigured) as refused:
            task_backends["default"]
    assert str(refused.value).startswith('TASKS["default"]["OPTIONS"]: ')
    assert named in str(refused.value)


@pytest.mark.parametrize(
    ("cron", "says"),
    [
        ("@hourly", "write the five fields '0 * * * *'"),
        ("@Daily", "write the five fields '0 0 * * *'"),
        ("@reboot", "write the five fields (minute"),
    ],
)
def test_a_cron_shortcut_is_refused_with_the_five_fields_it_stands_for(cron: str, says: str) -> None:
    # A new user's trial: "@hourly" was refused as "(Wrong number of fields)", cronsim's words, which do not say
    # that the shortcuts are not read or what to write instead.
    periodic = {"t": {"task": TASK, "cron": cron}}
    with override_settings(TASKS=tasks_setting("default", periodic=periodic)):
        with pytest.raises(ImproperlyConfigured) as refused:
            task_backends["default"]
    assert f"periodic['t']['cron'] {cron!r}: cron's @ shortcuts are not read: {says}" in str(refused.value)


@pytest.mark.parametrize(
    ("cron", "says"),
    [
        (
            "* * * * * */10",
            "the step */10 in the day-of-week field is longer than the field's range (0-6), so it matches only its "
            "first value: write that value instead (six fields put seconds first: second minute hour "
            "day-of-month month day-of-week)",
        ),
        (
            "*/90 * * * * *",
            "the step */90 in the second field is longer than the field's range (0-59), so it matches only its "
            "first value: write that value instead (six fields put seconds first: ",
        ),
        (
            "0 */24 * * *",
            "the step */24 in the hour field is longer than the field's range (0-23), so it matches only its first "
            "value: write that value instead (five fields: minute hour day-of-month month day-of-week)",
        ),
    ],
    ids=["day-of-week", "seconds", "five-fields"],
)
def test_a_step_longer_than_its_field_is_refused_naming_the_field_and_its_range(cron: str, says: str) -> None:
    # Before, "* * * * * */10" was refused with a message about "the seconds field", naming no field of its own and
    # without the reminder that six fields put seconds first.
    periodic = {"t": {"task": TASK, "cron": cron}}
    with override_settings(TASKS=tasks_setting("default", periodic=periodic)):
        with pytest.raises(ImproperlyConfigured) as refused:
            task_backends["default"]
    assert f"periodic['t']['cron'] {cron!r}: {says}" in str(refused.value)


@pytest.mark.parametrize(
    "path",
    [
        "lockkit_tests.tasks.jobs.no_such_task",
        "lockkit_tests.no_such_module.task",
        "lockkit_tests.tasks.jobs.Path",
    ],
)
@pytest.mark.django_db(transaction=True, available_apps=APPS)
def test_a_task_path_that_does_not_resolve_fails_the_checks_and_the_worker(path: str) -> None:
    named = 'TASKS["default"]["OPTIONS"]["periodic"][\'t\']["task"]'
    periodic = {"t": {"task": path, "cron": "* * * * *"}}
    with backend_on("default", periodic=periodic) as backend:
        errors = backend.check()
        assert [error.id for error in errors] == ["lockkit.tasks.E002"]
        assert named in errors[0].msg
        assert path in errors[0].msg
        with pytest.raises(ImproperlyConfigured, match=re.escape(named)):
            Worker(backend, queues=["default"])
    # manage.py lockkit_worker runs the system checks before it starts: it exits at once, naming the setting.
    with worker_process("default", "--burst", options={"periodic": periodic}) as worker:
        code, output = worker.wait(timeout=60)
    assert code == 1
    assert "lockkit.tasks.E002" in output
    assert named in output
    assert not PeriodicSchedule.objects.exists()


def test_the_admin_lists_schedules_read_only_with_their_ticks() -> None:
    model_admin = PeriodicScheduleAdmin(PeriodicSchedule, AdminSite())
    assert model_admin.check() == []
    request = RequestFactory().get("/")
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert {"name", "cron", "last_tick", "next_tick"} <= set(model_admin.list_display)


@pytest.mark.parametrize(
    ("zone", "expected"),
    [("UTC", datetime(2026, 1, 15, 3, tzinfo=UTC)), ("Europe/Paris", datetime(2026, 1, 15, 2, tzinfo=UTC))],
)
def test_cron_is_read_in_the_time_zone_setting(zone: str, expected: datetime) -> None:
    with override_settings(
        TIME_ZONE=zone, TASKS=tasks_setting("default", periodic={"n": {"task": TASK, "cron": "0 3 * * *"}})
    ):
        backend = task_backends["default"]
        assert isinstance(backend, DatabaseBackend)
        (schedule,) = backend.settings.periodic
        assert schedule.after(datetime(2026, 1, 15, 0, tzinfo=UTC)) == expected
        assert schedule.latest(expected + timedelta(hours=1)) == expected
        assert schedule.latest(expected) == expected
        assert schedule.latest(expected - timedelta(microseconds=1)) == expected - timedelta(days=1)


def test_an_active_time_zone_does_not_move_the_ticks() -> None:
    """A task that calls ``timezone.activate()`` and does not deactivate leaves its zone on the thread, which a
    ``--concurrency 1`` worker's loop shares: the ticks are still read in ``settings.TIME_ZONE`` (before, in the
    active zone: 03:00 in Kathmandu, 21:15 UTC)."""
    with (
        override_settings(
            TIME_ZONE="Europe/Paris",
            TASKS=tasks_setting("default", periodic={"n": {"task": TASK, "cron": "0 3 * * *"}}),
        ),
        timezone.override("Asia/Kathmandu"),
    ):
        backend = task_backends["default"]
        assert isinstance(backend, DatabaseBackend)
        (schedule,) = backend.settings.periodic
        expected = datetime(2026, 1, 15, 2, tzinfo=UTC)  # 03:00 in Paris
        assert schedule.after(datetime(2026, 1, 15, 0, tzinfo=UTC)) == expected
        assert schedule.latest(expected + timedelta(hours=1)) == expected


@pytest.mark.parametrize("alias", VENDORS)
@override_settings(TIME_ZONE="UTC")
def test_an_active_time_zone_does_not_move_the_ticks_a_worker_fires(alias: str) -> None:
    # As a --concurrency 1 worker's loop after a task called timezone.activate("Asia/Kathmandu") (+05:45): before,
    # the hourly ticks fired at a quarter past each UTC hour (Kathmandu's full hours).
    with timezone.override("Asia/Kathmandu"):
        ticks = _stepped_through(alias, datetime(2026, 3, 2, 9, 58, tzinfo=UTC), datetime(2026, 3, 2, 12, 1, tzinfo=UTC), {
            "tick": {"task": TASK, "cron": "0 * * * *"}
        })  # fmt: skip
    assert ticks == [datetime(2026, 3, 2, hour, tzinfo=UTC) for hour in (10, 11, 12)]


@pytest.mark.django_db(transaction=True, available_apps=APPS)
def test_a_lost_connection_is_logged_and_a_later_call_fires(caplog: pytest.LogCaptureFixture) -> None:
    alias = "default"
    with backend_on(alias, periodic=every(1)) as backend:
        periodic = Periodic(backend, alias)
        periodic.fire_due()  # reads (creates) the schedule's row
        created = PeriodicSchedule.objects.using(alias).get().created_at
        wait_for(lambda: timezone.now() > created + timedelta(seconds=1.1), timeout=5, what="a tick")
        caplog.set_level(logging.WARNING, logger="lockkit.tasks.periodic")
        # The session ends inside the call's transaction, after its opening (a refusal at the opening is retried
        # by the scope itself, for LOCKKIT["RETRY"]["reconnect_within"]).
        with ended_at_first_statement(alias, at=2):
            periodic.fire_due()
        assert [r.getMessage() for r in caplog.records if r.name == "lockkit.tasks.periodic"], "no warning"
        assert fired(alias) == []

        def fire() -> list[datetime]:
            periodic.fire_due()
            return fired(alias)

        # The first call after the pause replaces the dead connection and fires (the tick is due by then).
        ticks = wait_for(fire, timeout=RETRY_AFTER + 1.5, what="the first call after the pause to fire")
        warnings = [r for r in caplog.records if r.name == "lockkit.tasks.periodic"]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert_each_tick_once(ticks, 1)
    assert ticks[0] >= latest_tick(created, 1) + timedelta(seconds=1)


def test_without_cronsim_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # lockkit is not on PyPI: "pip install 'lockkit[periodic]'" would find nothing (or someone else's package).
    # `import cronsim` raises ImportError, as when it is not installed.
    monkeypatch.setitem(sys.modules, "cronsim", None)
    periodic = {"t": {"task": TASK, "cron": "* * * * *"}}
    with override_settings(TASKS=tasks_setting("default", periodic=periodic)):
        with pytest.raises(ImproperlyConfigured) as refused:
            task_backends["default"]
    assert "pip install 'cronsim>=2.7'" in str(refused.value)
    assert "lockkit[periodic]" not in str(refused.value)


@pytest.mark.parametrize(
    "names",
    [("Nightly", "nightly"), ("tick", "tick "), ("café", "cafe")],
    ids=["case", "trailing-space", "accent"],
)
@pytest.mark.parametrize("alias", VENDORS)
def test_two_schedule_names_the_database_compares_equal_never_crash_the_worker(
    alias: str, names: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """MariaDB's default collation compares names without case, accents or trailing spaces: two such schedules
    are one row there. The first fires, the second is named in an error and not fired; ``fire_due()`` never raises.
    Before, the second's lookup raised ``KeyError`` out of ``fire_due()``, which ended the worker at each start."""
    periodic = {name: {"task": TASK, "cron": "* * * * * *"} for name in names}
    caplog.set_level(logging.ERROR, logger="lockkit.tasks.periodic")
    with backend_on(alias, periodic=periodic) as backend:
        runner = Periodic(backend, alias)
        runner.fire_due()
        rows = PeriodicSchedule.objects.using(alias).count()
        created = max(PeriodicSchedule.objects.using(alias).values_list("created_at", flat=True))
        wait_for(lambda: timezone.now() > created + timedelta(seconds=2.1), timeout=5, what="two ticks")
        runner.fire_due()
        runner.fire_due()  # the next call works
    per_tick: dict[datetime, int] = {}
    for tick in fired(alias):
        per_tick[tick] = per_tick.get(tick, 0) + 1
    assert per_tick
    assert set(per_tick.values()) == {rows}, per_tick  # each tick once per row
    errors = [r.getMessage() for r in caplog.records if r.name == "lockkit.tasks.periodic"]
    if rows == 1:  # MariaDB
        assert len(errors) == 1, errors
        assert all(repr(name) in errors[0] for name in names), errors
    else:
        assert rows == 2
        assert errors == []


@pytest.mark.django_db(transaction=True, available_apps=APPS)
def test_a_task_enqueued_receiver_that_raises_does_not_end_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The periodic enqueue sends ``task_enqueued`` in the tick's transaction: a receiver's error rolls the tick back
    and is logged; the tick fires once the receiver works. Before, the error escaped ``fire_due()`` and ended the
    worker's loop, at every start while the receiver failed."""
    alias = "default"

    def failing(sender: Any, task_result: Any, **kwargs: Any) -> None:
        raise RuntimeError("metrics service down")

    caplog.set_level(logging.WARNING, logger="lockkit.tasks.periodic")
    with backend_on(alias, periodic=every(1)) as backend:
        runner = Periodic(backend, alias)
        runner.fire_due()
        created = PeriodicSchedule.objects.using(alias).get().created_at
        wait_for(lambda: timezone.now() > created + timedelta(seconds=1.1), timeout=5, what="a tick")
        task_enqueued.connect(failing)
        try:
            runner.fire_due()
        finally:
            task_enqueued.disconnect(failing)
        assert fired(alias) == []  # rolled back with the tick
        assert any(r.exc_info and "metrics service down" in str(r.exc_info[1]) for r in caplog.records)

        def fire() -> list[datetime]:
            runner.fire_due()
            return fired(alias)

        ticks = wait_for(fire, timeout=RETRY_AFTER + 1.5, what="the tick")
    assert_each_tick_once(ticks, 1)


def _stepped_through(alias: str, start: datetime, end: datetime, periodic: dict[str, Any]) -> list[datetime]:
    """Run one worker's ``Periodic`` with its clock stepped 15 s at a time from ``start`` to ``end``."""
    clock = [start]
    with (
        backend_on(alias, periodic=periodic) as backend,
        mock.patch.object(timezone, "now", side_effect=lambda: clock[0]),
    ):
        firing = Periodic(backend, alias)
        while clock[0] < end:
            clock[0] += timedelta(seconds=15)
            firing.fire_due()
    return fired(alias)


@pytest.mark.parametrize("alias", VENDORS)
@override_settings(TIME_ZONE="Europe/Berlin")
def test_the_repeated_hour_of_an_autumn_dst_change_fires_both_ticks(alias: str) -> None:
    # 2026-10-25 in Berlin: 02:00 CEST (00:00Z), 02:00 CET (01:00Z), 03:00 CET (02:00Z). Found by a hostile review:
    # 01:00Z was skipped, its tick comparing equal to 00:00Z's as a wall-clock time in one zone.
    hourly = {"tick": {"task": TASK, "cron": "0 * * * *"}}
    ticks = _stepped_through(
        alias, datetime(2026, 10, 24, 21, 30, tzinfo=UTC), datetime(2026, 10, 25, 4, 30, tzinfo=UTC), hourly
    )
    assert [tick.astimezone(UTC).hour for tick in ticks] == [22, 23, 0, 1, 2, 3, 4]


@pytest.mark.parametrize("alias", VENDORS)
@override_settings(USE_TZ=False, TIME_ZONE="Europe/Berlin")
def test_without_use_tz_schedules_fire_in_time_zones_wall_clock(alias: str) -> None:
    # Found by a hostile review: with USE_TZ = False every tick raised ("localtime() cannot be applied to a naive
    # datetime") and nothing was ever enqueued.
    ticks = _stepped_through(alias, datetime(2026, 3, 2, 9, 58), datetime(2026, 3, 2, 12, 1), {
        "tick": {"task": TASK, "cron": "0 * * * *"}
    })  # fmt: skip
    assert ticks == [datetime(2026, 3, 2, hour) for hour in (10, 11, 12)]


@pytest.mark.parametrize("alias", VENDORS)
def test_a_changed_schedule_is_shown_as_it_now_fires(alias: str) -> None:
    # Found by a hostile review: after a restart with a changed cron the admin showed the old cron and a past next
    # tick until the next fire (a year away there).
    now = timezone.now()
    with backend_on(alias, periodic={"tick": {"task": TASK, "cron": "* * * * * *"}}) as backend:
        Periodic(backend, alias).fire_due()
    with backend_on(alias, periodic={"tick": {"task": TASK, "cron": "0 0 1 1 *"}}) as backend:
        Periodic(backend, alias).fire_due()
    row = PeriodicSchedule.objects.using(alias).get(name="tick")
    assert row.cron == "0 0 1 1 *"
    assert row.next_tick is not None
    assert row.next_tick > now + timedelta(days=1)  # next New Year's midnight, not a past per-second tick
