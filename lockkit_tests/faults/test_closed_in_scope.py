"""A body that closes its scope's connection is never reported as done (found by a review).

``connection.close()`` inside ``atomic()`` (``close_old_connections()`` does it too: the scope turned autocommit off,
which differs from the settings) drops the transaction: the server rolls it back. Django then ends the block
without an error, and the scope returned normally with its writes gone.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import close_old_connections, connections, transaction

import lockkit
from lockkit import RetryEvent, RetryPolicy
from lockkit_tests.models import Stock
from lockkit_tests.support.vendors import vendor_params

CLOSERS: list[Callable[[str], None]] = [
    lambda alias: connections[alias].close(),
    lambda alias: close_old_connections(),
]


@pytest.mark.parametrize("close", CLOSERS, ids=["close", "close_old_connections"])
@pytest.mark.parametrize("alias", vendor_params())
def test_a_locked_operation_whose_body_closes_the_connection_raises_and_commits_nothing(
    alias: str, close: Callable[[str], None]
) -> None:
    Stock.objects.using(alias).create(sku="a", available=5)
    events: list[RetryEvent] = []
    callbacks: list[str] = []

    @lockkit.locked_operation(using=alias, retry=RetryPolicy(before_retry=events.append))
    def sell() -> int:
        scope = lockkit.current_scope()
        row = scope.get(Stock.objects.using(alias), pk="a")
        row.available -= 1
        row.save(using=alias)
        scope.on_commit(lambda: callbacks.append("sent"))
        close(alias)
        return row.available

    with pytest.raises(lockkit.TransactionAborted, match="closed inside the scope"):
        sell()
    assert (events, callbacks) == ([], [])
    assert Stock.objects.using(alias).get().available == 5
    with lockkit.locked(alias) as scope:  # the next call on the same alias works
        row = scope.get(Stock.objects.using(alias), pk="a")
        row.available -= 1
        row.save(using=alias)
    assert Stock.objects.using(alias).get().available == 4


@pytest.mark.parametrize("alias", vendor_params())
def test_a_nested_scope_whose_body_closes_the_connection_raises(alias: str) -> None:
    Stock.objects.using(alias).create(sku="a", available=5)
    with pytest.raises(lockkit.TransactionAborted, match="closed inside the scope"):
        with transaction.atomic(using=alias), lockkit.locked(alias) as scope:
            row = scope.get(Stock.objects.using(alias), pk="a")
            row.available -= 1
            row.save(using=alias)
            connections[alias].close()
    assert Stock.objects.using(alias).get().available == 5
