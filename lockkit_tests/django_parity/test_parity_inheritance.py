"""``of=`` with multi-table inheritance, proxies and nullable joins: which rows a lockkit lock holds.

lockkit locks ``of=("self", ...)`` where the backend supports ``OF`` (PostgreSQL), so that
``select_related()`` on a nullable foreign key works and leaves related rows alone. An object of a multi-table
child model lives in one row per table of its chain: locking it must lock them all, or a session locking the
parent row would not wait.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, connections, transaction

from lockkit import LockNotAvailable, locked
from lockkit.testing import assert_single_alias, hold_lock, in_thread
from lockkit_tests.models import (
    PeerCity,
    PeerCountry,
    PeerCountryProxy,
    PeerEntity,
    PeerEUCountry,
    PeerPerson,
)
from lockkit_tests.support.parity_world import make_world
from lockkit_tests.support.vendors import vendor_params

pytestmark = pytest.mark.contention
BOTH = vendor_params()


def _nowait_free(alias: str, queryset: Any) -> bool:
    """Whether this session can lock the queryset's rows at once (FOR UPDATE NOWAIT)."""
    with transaction.atomic(using=alias):
        try:
            with transaction.atomic(using=alias):
                list(queryset.using(alias).select_for_update(nowait=True))
        except DatabaseError:  # a lock failure means "not free"; the savepoint keeps the transaction usable
            return False
    return True


@pytest.mark.parametrize("alias", BOTH)
@pytest.mark.parametrize(
    "parent",
    [pytest.param(PeerCountry, id="parent"), pytest.param(PeerEntity, id="grandparent")],
)
def test_locking_a_child_model_locks_its_parents_rows(alias: str, parent: type[Any]) -> None:
    world = make_world(alias)
    pk = world.eu_country.pk
    with locked(alias) as scope:
        assert scope.get(PeerEUCountry, pk=pk).name == "France"
        # Another session locking the parent's (or grandparent's) row of the object must be refused.
        free = _run_elsewhere(alias, parent.objects.filter(pk=pk))
    assert free is False


@pytest.mark.parametrize("alias", BOTH)
def test_a_proxy_locks_the_concrete_rows(alias: str) -> None:
    world = make_world(alias)
    with hold_lock(PeerCountry.objects.using(alias).filter(pk=world.country.pk)):
        with pytest.raises(LockNotAvailable), locked(alias, nowait=True) as scope:
            scope.get(PeerCountryProxy, pk=world.country.pk)
        with pytest.raises(LockNotAvailable), locked(alias, nowait=True) as scope:
            scope.get(PeerEntity, pk=world.country.pk)


@pytest.mark.parametrize("alias", BOTH)
def test_a_lock_with_a_nullable_join_locks_the_queried_rows_only_where_of_is_supported(alias: str) -> None:
    world = make_world(alias)
    with assert_single_alias(alias) as log, locked(alias) as scope:
        person = scope.lock(PeerPerson).select_related("born", "died").get(pk=world.person.pk)
        assert person.died is not None
        assert person.died.name == "Samois-sur-Seine"
        city_free = _run_elsewhere(alias, PeerCity.objects.filter(pk=world.city2.pk))
        person_free = _run_elsewhere(alias, PeerPerson.objects.filter(pk=world.person.pk))
    assert person_free is False
    locking = next(sql for sql in log.on(alias) if "FOR UPDATE" in sql.upper())
    if connections[alias].features.has_select_for_update_of:
        assert " OF " in locking.upper()
        assert city_free is True  # the related city is not locked
    else:
        assert city_free is False  # no OF: the database locks every joined row


def _run_elsewhere(alias: str, queryset: Any) -> bool:
    return in_thread(_nowait_free, alias, queryset).result(timeout=10)
