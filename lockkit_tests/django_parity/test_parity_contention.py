"""Django's contention group, against lockkit scopes: NOWAIT, SKIP LOCKED, a blocked lock, raw NOWAIT.

Django's originals sleep a second per test and join threads without a timeout; these wait on the database's
own report of who is blocked (``wait_until_blocked``) and bound every join.
"""

from __future__ import annotations

import pytest
from django.db import OperationalError, connections, transaction

import lockkit
from lockkit import Failure, LockNotAvailable, locked
from lockkit.testing import hold_lock, in_thread, wait_until_blocked
from lockkit_tests.models import PeerPerson
from lockkit_tests.support.parity_world import make_world
from lockkit_tests.support.vendors import vendor_params

pytestmark = pytest.mark.contention
BOTH = vendor_params()


@pytest.mark.parametrize("alias", BOTH)
def test_nowait_raises_on_a_locked_row(alias: str) -> None:
    world = make_world(alias)
    with hold_lock(world.person):
        with pytest.raises(LockNotAvailable) as caught, locked(alias, nowait=True) as scope:
            scope.get(PeerPerson, pk=world.person.pk)
        # The failed scope left this thread's connection usable, outside any transaction.
        assert not connections[alias].in_atomic_block
        assert PeerPerson.objects.using(alias).get(pk=world.person.pk).name == "Reinhardt"
    error = caught.value
    assert isinstance(error, OperationalError)  # existing `except OperationalError` keeps working
    assert error.alias == alias
    assert isinstance(error.__cause__, OperationalError)


@pytest.mark.parametrize("alias", BOTH)
def test_skip_locked_skips_a_locked_row(alias: str) -> None:
    world = make_world(alias)
    other = PeerPerson.objects.using(alias).create(name="Grappelli", born=world.city1)
    with hold_lock(world.person), locked(alias, skip_locked=True) as scope:
        assert [p.pk for p in scope.lock(PeerPerson).order_by("pk")] == [other.pk]
        with pytest.raises(PeerPerson.DoesNotExist):
            scope.get(PeerPerson, pk=world.person.pk)


@pytest.mark.parametrize("alias", BOTH)
def test_a_lock_blocks_then_sees_the_committed_value(alias: str) -> None:
    world = make_world(alias)
    rows = PeerPerson.objects.using(alias).filter(pk=world.person.pk)

    def rename() -> str:
        with locked(alias, lock_timeout=10) as scope:
            person = scope.get(PeerPerson, pk=world.person.pk)
            person.name += " (seen by the contender)"
            person.save(update_fields=["name"])
            return person.name

    with hold_lock(world.person) as holder:
        contender = in_thread(rename)
        assert len(wait_until_blocked(holder, contenders=contender)) == 1
        # A plain read does not wait for the lock, and sees the old value.
        assert rows.get().name == "Reinhardt"
        holder.run(lambda: rows.update(name="Fred"))
        holder.release(commit=True)
    assert contender.result(timeout=10) == "Fred (seen by the contender)"
    assert rows.get().name == "Fred (seen by the contender)"


def _raw_nowait_sql(alias: str) -> str:
    # Identifiers only, quoted by the backend; no value is formatted into the statement.
    ops = connections[alias].ops
    return f"SELECT * FROM {ops.quote_name(PeerPerson._meta.db_table)} {ops.for_update_sql(nowait=True)}"


@pytest.mark.parametrize("alias", BOTH)
def test_raw_nowait_on_a_locked_row(alias: str) -> None:
    world = make_world(alias)
    sql = _raw_nowait_sql(alias)
    with hold_lock(world.person):
        # Outside lockkit: Django's own error. Told that the statement used NOWAIT, classify() says so; without
        # context it gives the code's own meaning (PostgreSQL's 55P03 is lock_not_available, MariaDB's 1205 a
        # lock wait timeout, which MariaDB also raises for NOWAIT).
        with pytest.raises(OperationalError) as plain, transaction.atomic(using=alias):
            list(PeerPerson.objects.raw(sql).using(alias))
        assert lockkit.classify(plain.value, nowait=True) is Failure.LOCK_NOT_AVAILABLE
        own_meaning = {"postgresql": Failure.LOCK_NOT_AVAILABLE, "mysql": Failure.LOCK_TIMEOUT}
        assert lockkit.classify(plain.value) is own_meaning[connections[alias].vendor]
        # Inside a nowait scope, a raw query's failure is raised as lockkit's typed error too.
        with pytest.raises(LockNotAvailable), locked(alias, nowait=True):
            list(PeerPerson.objects.raw(sql).using(alias))
