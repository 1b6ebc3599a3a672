"""Django's guard tests, against lockkit scopes: what is refused, when, and on which alias locks run."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import NotSupportedError, connections, transaction
from django.db.transaction import TransactionManagementError

import lockkit
from lockkit import AliasMismatch, LockNotAvailable, NotInLockedScope, locked, locked_operation
from lockkit.testing import assert_single_alias, hold_lock, in_thread, wait_until_blocked
from lockkit_tests.models import PeerPerson, RemoteItem
from lockkit_tests.support.parity_world import make_world
from lockkit_tests.support.vendors import vendor_params

pytestmark = pytest.mark.contention
BOTH = vendor_params()
KEYWORDS = {"nowait": "NOWAIT", "skip_locked": "SKIP LOCKED", "no_key": "FOR NO KEY UPDATE"}


@pytest.mark.parametrize("alias", BOTH)
def test_a_lock_needs_a_transaction_checked_only_when_evaluated(alias: str) -> None:
    world = make_world(alias)
    with assert_single_alias(alias) as log, locked(alias) as scope:
        before = len(log.queries)
        people = scope.lock(PeerPerson)  # lazy: building the queryset runs no SQL
        assert len(log.queries) == before
        assert [p.pk for p in people] == [world.person.pk]
    # The same lazy queryset evaluated after the scope: Django refuses it (no transaction).
    leftover = people.filter(pk=world.person.pk)
    with pytest.raises(TransactionManagementError, match="outside of a transaction"):
        list(leftover)
    # lockkit's helpers are checked when called: outside any scope, and on a scope that has ended.
    with pytest.raises(NotInLockedScope):
        lockkit.lock(PeerPerson)
    with pytest.raises(NotInLockedScope):
        scope.lock(PeerPerson)


@pytest.mark.parametrize("alias", BOTH)
def test_nowait_with_skip_locked_is_refused_before_any_sql(alias: str) -> None:
    with assert_single_alias(alias) as log:
        with pytest.raises(ValueError, match="nowait and skip_locked"):
            locked(alias, nowait=True, skip_locked=True)
        with pytest.raises(ValueError, match="nowait and skip_locked"):
            locked_operation(alias, nowait=True, skip_locked=True)
    assert log.queries == []


@pytest.mark.parametrize("alias", BOTH)
def test_options_the_backend_cannot_honour_are_refused_per_backend(alias: str) -> None:
    world = make_world(alias)
    features = connections[alias].features
    for option, supported in (
        ("nowait", features.has_select_for_update_nowait),
        ("skip_locked", features.has_select_for_update_skip_locked),
        ("no_key", features.has_select_for_no_key_update),
    ):
        options: dict[str, Any] = {option: True}
        if supported:
            with assert_single_alias(alias) as log, locked(alias, **options) as scope:
                assert scope.get(PeerPerson, pk=world.person.pk).name == "Reinhardt"
            locking = [sql for sql in log.on(alias) if "FOR " in sql.upper()]
            keyword = KEYWORDS[option]
            assert any(keyword in sql.upper() for sql in locking), (option, locking)
        else:
            with assert_single_alias(alias) as log, pytest.raises(NotSupportedError, match=option):
                locked(alias, **options).__enter__()
            assert log.queries == [], f"{option}: refused only after running SQL"
    vendor = connections[alias].vendor
    assert (vendor, features.has_select_for_no_key_update) in {("postgresql", True), ("mysql", False)}


@pytest.mark.parametrize("alias", BOTH)
def test_slicing_a_lock_where_the_backend_has_no_limit_with_for_update(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world(alias)
    second = PeerPerson.objects.using(alias).create(name="Grappelli", born=world.city1)
    with locked(alias) as scope:
        assert list(scope.lock(PeerPerson).order_by("pk")[1:2]) == [second]
    # Oracle's case: the feature flag is what Django consults; the database is real and untouched.
    monkeypatch.setattr(connections[alias].features, "supports_select_for_update_with_limit", False)
    with locked(alias) as scope:
        sliced = scope.lock(PeerPerson).order_by("pk")[1:2]
        with pytest.raises(NotSupportedError, match="LIMIT/OFFSET"):
            list(sliced)
        # lock_all() does not slice, so it stays usable there.
        assert [p.pk for p in scope.lock_all(PeerPerson)] == [world.person.pk, second.pk]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_the_lock_runs_on_the_routers_write_alias() -> None:
    item = RemoteItem.objects.create(name="remote", value=1)  # routed to "other"
    with assert_single_alias("other") as log, locked(model=RemoteItem) as scope:
        assert scope.alias == "other"
        assert scope.get(RemoteItem, pk=item.pk).value == 1
        with pytest.raises(AliasMismatch):
            scope.lock(RemoteItem.objects.using("default"))
    assert any("FOR UPDATE" in sql.upper() for sql in log.on("other"))
    # The lock really is taken on "other": a holder there makes a nowait scope on the model fail.
    with hold_lock(item) as holder:
        assert holder.alias == "other"
        with pytest.raises(LockNotAvailable) as caught, locked(model=RemoteItem, nowait=True) as scope:
            scope.get(RemoteItem, pk=item.pk)
        assert caught.value.alias == "other"


def _subquery_order(alias: str) -> str:
    with locked(alias) as scope:
        inner = scope.lock(PeerPerson).order_by("-pk").values("pk")
        outer = PeerPerson.objects.using(alias).filter(pk__in=inner)
        sql, _params = outer.query.get_compiler(using=alias).as_sql()
        return str(sql)


@pytest.mark.parametrize("alias", BOTH)
def test_ordered_locking_is_kept_in_subqueries_and_lock_all_takes_rows_in_key_order(alias: str) -> None:
    world = make_world(alias)
    assert "ORDER BY" in _subquery_order(alias)
    last = PeerPerson.objects.using(alias).create(name="Grappelli", born=world.city1)

    def lock_in_reverse() -> list[int]:
        with locked(alias, lock_timeout=10) as scope:
            return [p.pk for p in scope.lock_all(PeerPerson, pks=[last.pk, world.person.pk])]

    # The first row in key order is held: a contender locking in key order waits there, holding nothing else
    # yet, so the last row is still free. One locking in the order given would hold it: a deadlock risk.
    with hold_lock(world.person) as holder:
        contender = in_thread(lock_in_reverse)
        wait_until_blocked(holder, contenders=contender)
        with transaction.atomic(using=alias):
            rows = PeerPerson.objects.using(alias).select_for_update(nowait=True).filter(pk=last.pk)
            assert [p.pk for p in rows] == [last.pk]
    assert contender.result(timeout=10) == [last.pk, world.person.pk]  # returned in the order asked
