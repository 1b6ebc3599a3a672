"""Bounded migrations: an ``ALTER TABLE`` behind a held row lock fails fast with ``LockTimeout`` and succeeds once
the lock is free; transaction-scoped in atomic migrations, session-scoped and always reset in non-atomic ones."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.apps import apps
from django.db import connections, migrations, models
from django.db.migrations.state import ProjectState
from django.db.migrations.writer import MigrationWriter

import lockkit.inspection
from lockkit import LockTimeout
from lockkit.ddl import Bounded, bounded_lock_waits
from lockkit.testing import hold_lock, in_thread, wait_until_blocked
from lockkit_tests.models import Item
from lockkit_tests.support.vendors import vendor_params

BOTH = vendor_params()
ADD_NOTE = migrations.AddField("item", "note", models.IntegerField(null=True))


def _setting(alias: str) -> str:
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT current_setting('lock_timeout')")
        else:
            cursor.execute(
                "SELECT CONCAT(@@SESSION.lock_wait_timeout, '/', @@SESSION.innodb_lock_wait_timeout)"
            )
        return str(cursor.fetchone()[0])


def _columns(alias: str) -> set[str]:
    connection = connections[alias]
    with connection.cursor() as cursor:
        return {c.name for c in connection.introspection.get_table_description(cursor, Item._meta.db_table)}


@contextmanager
def _migrating(alias: str, operation: Bounded, *, atomic: bool) -> Iterator[None]:
    """Apply ``operation`` as the migration executor does; undo it afterwards if it was applied."""
    before = ProjectState.from_apps(apps)
    after = before.clone()
    operation.state_forwards("lockkit_tests", after)
    connection = connections[alias]
    with connection.schema_editor(atomic=atomic) as editor:
        operation.database_forwards("lockkit_tests", editor, before, after)
    try:
        yield
    finally:
        with connection.schema_editor(atomic=atomic) as editor:
            operation.database_backwards("lockkit_tests", editor, after, before)


@pytest.mark.contention
@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "non-atomic"])
@pytest.mark.parametrize("alias", BOTH)
def test_alter_table_behind_a_row_lock_fails_fast_then_succeeds(alias: str, atomic: bool) -> None:
    item = Item.objects.using(alias).create(name="busy")
    outside = _setting(alias)
    operation = Bounded([ADD_NOTE], lock_timeout=0.3)
    with hold_lock(item, using=alias):
        with pytest.raises(LockTimeout) as caught:
            with _migrating(alias, operation, atomic=atomic):
                pytest.fail("the ALTER TABLE must not get its lock")
        assert caught.value.alias == alias
        assert caught.value.sqlstate == ("55P03" if alias == "default" else "1205")
        assert "note" not in _columns(alias)
        # Session-scoped or not, the bound did not outlive the migration, even after the failure.
        assert _setting(alias) == outside
    with _migrating(alias, operation, atomic=atomic):
        assert "note" in _columns(alias)
        assert _setting(alias) == outside
    assert "note" not in _columns(alias)


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_in_an_atomic_migration_the_bound_is_transaction_scoped() -> None:
    seen: list[str] = []

    class Probe(migrations.RunPython):
        def __init__(self) -> None:
            super().__init__(
                lambda apps_, editor: seen.append(_setting("default")), migrations.RunPython.noop
            )

    with _migrating("default", Bounded([ADD_NOTE, Probe()], lock_timeout=2), atomic=True):
        pass
    assert seen == ["2s"]  # inside the migration's transaction (set_config(..., true))
    assert _setting("default") == "0"


@pytest.mark.parametrize("alias", BOTH)
def test_bounded_lock_waits_resets_the_session_on_every_path(alias: str) -> None:
    outside = _setting(alias)
    with pytest.raises(ZeroDivisionError):
        with bounded_lock_waits(1.5, using=alias):
            assert _setting(alias) == ("1500ms" if alias == "default" else "2/2")
            _ = 1 / 0
    assert _setting(alias) == outside


def test_bounded_is_a_serializable_migration_operation() -> None:
    operation = Bounded([ADD_NOTE], lock_timeout=3)
    text, imports = MigrationWriter.serialize(operation)
    assert text.startswith("lockkit.ddl.Bounded(")
    assert "lock_timeout=3" in text
    assert "operations=[" in text
    assert "import lockkit.ddl" in imports
    # The written text builds the same operation again.
    rebuilt = eval(text, {"lockkit": __import__("lockkit.ddl"), "migrations": migrations, "models": models})
    assert MigrationWriter.serialize(rebuilt)[0] == text
    assert operation.describe() == "With lock waits bounded to 3s: Add field note to item"
    assert operation.reversible


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (([],), {"lock_timeout": 1}, ValueError),
        ((ADD_NOTE,), {"lock_timeout": 1}, TypeError),
        ((["ALTER TABLE x"],), {"lock_timeout": 1}, TypeError),
        (([ADD_NOTE],), {"lock_timeout": 0}, ValueError),
        (([ADD_NOTE],), {"lock_timeout": True}, TypeError),
    ],
)
def test_bad_arguments_are_refused_when_the_migration_loads(
    args: tuple[object, ...], kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        Bounded(*args, **kwargs)  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_on_sqlite_the_bound_is_the_busy_timeout_and_is_reset() -> None:
    def busy() -> int:
        with connections["sqlite"].cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout")
            return int(cursor.fetchone()[0])

    outside = busy()
    with pytest.raises(ZeroDivisionError), bounded_lock_waits(0.25, using="sqlite"):
        assert busy() == 250
        _ = 1 / 0
    assert busy() == outside


@pytest.mark.contention
@pytest.mark.parametrize("alias", BOTH)
def test_a_waiting_alter_table_shows_in_lock_inspection(alias: str) -> None:
    item = Item.objects.using(alias).create(name="busy")
    operation = Bounded([ADD_NOTE], lock_timeout=30)
    before = ProjectState.from_apps(apps)
    after = before.clone()
    operation.state_forwards("lockkit_tests", after)

    def migrate() -> None:
        with connections[alias].schema_editor(atomic=False) as editor:
            operation.database_forwards("lockkit_tests", editor, before, after)

    try:
        with hold_lock(item, using=alias) as holder:
            migrating = in_thread(migrate)
            wait_until_blocked(holder, contenders=migrating)
            (found,) = lockkit.inspection.blocking(alias)
            assert holder.pid in found.blocking_pids
            assert "ALTER TABLE" in (found.waiting.query or "").upper()
            assert Item._meta.db_table in (found.target or "")
            if alias == "default":
                assert (found.lock_kind, found.mode) == ("relation", "AccessExclusiveLock")
            else:
                assert found.lock_kind == "metadata lock"
        migrating.result(timeout=30)
        assert "note" in _columns(alias)
    finally:
        if "note" in _columns(alias):
            with connections[alias].schema_editor(atomic=False) as editor:
                operation.database_backwards("lockkit_tests", editor, after, before)
