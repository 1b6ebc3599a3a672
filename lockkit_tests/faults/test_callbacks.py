"""lockkit's own record of ``scope.on_commit`` callbacks, when a COMMIT's reply is lost.

Django forgets its ``on_commit`` list when the COMMIT fails; when lockkit then finds that the transaction committed
(``deliver``: the server committed, the reply was cut) it runs the callbacks registered through ``scope.on_commit``,
each once, in order, and only those of the transaction that committed: not a failed attempt's (``abort``), not a
nested scope's that rolled back (by an error or ``set_rollback(True)``). A callback registered directly with ``transaction.on_commit`` is Django's alone,
and Django drops it (docs/reliability.md says so).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import transaction

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit_harness.proxy import Action, FaultProxy
from lockkit_tests.models import Item, Stock

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "proxied"])


class Inner(Exception):
    """Raised inside a nested scope to roll it back."""


def _operation(
    alias: str, proxy: FaultProxy, action: Action | None, ran: list[str], events: list[RetryEvent]
) -> Callable[[], int]:
    """Sell one widget, registering callbacks before and after the write and in three nested scopes."""

    @lockkit.locked_operation(alias, retry=RetryPolicy(before_retry=events.append))
    def sell() -> int:
        scope = lockkit.current_scope()
        n = scope.attempt

        def note(label: str) -> None:
            scope.on_commit(lambda: ran.append(f"{label}-{n}"))

        row = scope.get(Stock, pk="widget")
        note("before")
        row.available -= 1
        row.save(using=alias)
        note("after")
        with pytest.raises(Inner), lockkit.locked(alias) as inner:
            inner.on_commit(lambda: ran.append(f"rolled-back-{n}"))
            Item.objects.using(alias).create(name="rolled back")
            raise Inner
        with lockkit.locked(alias) as inner:
            inner.on_commit(lambda: ran.append(f"nested-{n}"))
            Item.objects.using(alias).create(name="nested")
        with lockkit.locked(alias) as inner:  # no error, but rolled back all the same
            inner.on_commit(lambda: ran.append(f"set-rollback-{n}"))
            Item.objects.using(alias).create(name="set rollback")
            transaction.set_rollback(True, using=alias)
        note("last")
        if action is not None and n == 1:
            proxy.arm(action)  # acts on this attempt's COMMIT
        return row.available

    return sell


@pytest.mark.parametrize("action", [None, "deliver"])
def test_each_callback_of_the_transaction_that_committed_runs_once_in_order(
    through_proxy: tuple[str, FaultProxy], action: Action | None
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    ran: list[str] = []
    events: list[RetryEvent] = []
    assert _operation(alias, proxy, action, ran, events)() == 4  # returns normally
    if action is not None:
        assert proxy.cuts[action] == 1  # the reply really was cut
    assert ran == ["before-1", "after-1", "nested-1", "last-1"]
    assert events == []
    assert Stock.objects.get().available == 4
    assert list(Item.objects.values_list("name", flat=True)) == ["nested"]


def test_the_callbacks_of_an_attempt_whose_commit_never_arrived_never_run(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    ran: list[str] = []
    events: list[RetryEvent] = []
    assert _operation(alias, proxy, "abort", ran, events)() == 4
    assert proxy.cuts["abort"] == 1
    assert [(e.attempt, e.failure) for e in events] == [(1, Failure.CONNECTION_LOST)]
    assert ran == ["before-2", "after-2", "nested-2", "last-2"]
    assert Stock.objects.get().available == 4
    assert list(Item.objects.values_list("name", flat=True)) == ["nested"]


def test_a_callback_registered_with_django_directly_is_dropped_when_the_reply_is_lost(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    """What docs/reliability.md says: only ``scope.on_commit`` callbacks are in lockkit's record."""
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    ran: list[str] = []

    @lockkit.locked_operation(alias)
    def sell() -> int:
        scope = lockkit.current_scope()
        row = scope.get(Stock, pk="widget")
        row.available -= 1
        row.save(using=alias)
        transaction.on_commit(lambda: ran.append("django"), using=alias)
        scope.on_commit(lambda: ran.append("lockkit"))
        proxy.arm("deliver")
        return row.available

    assert sell() == 4
    assert proxy.cuts["deliver"] == 1
    assert ran == ["lockkit"]  # Django's own callback is gone with the connection
    assert Stock.objects.get().available == 4
    # Without a lost reply Django runs both, as usual.
    Stock.objects.filter(pk="widget").update(available=5)
    ran.clear()

    @lockkit.locked_operation(alias)
    def sell_again() -> None:
        scope = lockkit.current_scope()
        scope.get(Stock, pk="widget")
        transaction.on_commit(lambda: ran.append("django"), using=alias)
        scope.on_commit(lambda: ran.append("lockkit"))

    sell_again()
    assert ran == ["django", "lockkit"]


def test_a_callback_registered_inside_a_plain_atomic_block_that_rolled_back_never_runs(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    ran: list[str] = []

    @lockkit.locked_operation(alias)
    def sell() -> None:
        scope = lockkit.current_scope()
        scope.get(Stock, pk="widget")
        with pytest.raises(Inner), transaction.atomic(using=alias):
            scope.on_commit(lambda: ran.append("rolled back"))
            raise Inner
        scope.on_commit(lambda: ran.append("committed"))
        proxy.arm("deliver")

    sell()
    assert proxy.cuts["deliver"] == 1
    assert ran == ["committed"]
