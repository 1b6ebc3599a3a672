"""A lost reply to ``UPDATE ...; COMMIT`` (``save_with_commit``) is resolved like any lost COMMIT, never guessed.

A ``FaultProxy`` between Django and the server acts on the message that ends with ``COMMIT``: ``deliver`` lets the
server commit and cuts the reply, ``abort`` never forwards it (the server rolls back), ``hold`` keeps the server's
transaction open while the client looks for the outcome. Each time the next call in the same process works.
"""

from __future__ import annotations

import pytest
from django.db import connection

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit_harness.proxy import FaultProxy
from lockkit_harness.sessions import session_of, terminate
from lockkit_tests.models import Stock

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "proxied"])


def _sale(alias: str, proxy: FaultProxy, action: str | None):  # type: ignore[no-untyped-def]
    record: dict[str, list[object]] = {"attempts": [], "callbacks": [], "events": []}

    @lockkit.locked_operation(alias, retry=RetryPolicy(before_retry=record["events"].append))
    def sell() -> int:
        scope = lockkit.current_scope()
        record["attempts"].append(scope.attempt)
        row = scope.get(Stock, pk="widget")
        row.available -= 1
        scope.on_commit(lambda: record["callbacks"].append("sent"))
        if action is not None and scope.attempt == 1:
            proxy.arm(action)  # type: ignore[arg-type]
        scope.save_with_commit(row, update_fields=["available"])
        return row.available

    return sell, record


def test_a_lost_reply_of_a_message_that_committed_returns_and_runs_the_callbacks_once(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    sell, record = _sale(alias, proxy, "deliver")
    assert sell() == 4
    assert proxy.cuts["deliver"] == 1  # the reply really was cut
    assert record["attempts"] == [1]
    assert record["callbacks"] == ["sent"]
    assert record["events"] == []
    assert Stock.objects.get().available == 4
    again, _ = _sale(alias, proxy, None)
    assert again() == 3  # the next call in the same process works
    assert Stock.objects.get().available == 3


def test_a_lost_message_that_never_arrived_is_retried_once(through_proxy: tuple[str, FaultProxy]) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    sell, record = _sale(alias, proxy, "abort")
    assert sell() == 4
    assert proxy.cuts["abort"] == 1
    assert record["attempts"] == [1, 2]
    assert record["callbacks"] == ["sent"]
    assert [e.failure for e in record["events"] if isinstance(e, RetryEvent)] == [Failure.CONNECTION_LOST]
    assert Stock.objects.get().available == 4


def test_an_undecided_message_raises_commit_outcome_unknown(through_proxy: tuple[str, FaultProxy]) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    sell, record = _sale(alias, proxy, "hold")
    with pytest.raises(lockkit.CommitOutcomeUnknown) as caught:
        sell()
    assert isinstance(caught.value.xid, int)
    assert caught.value.alias == alias
    assert record["attempts"] == [1]  # never retried blindly
    assert record["callbacks"] == []
    proxy.release_held()  # the held transaction ends without its COMMIT: rolled back
    again, _ = _sale(alias, proxy, None)
    assert again() == 4
    assert Stock.objects.get().available == 4


@pytest.mark.django_db(transaction=True)
def test_a_session_terminated_between_the_compiled_get_and_the_save_is_retried_once() -> None:
    """The scope's kept cursor belongs to a dead session: the save fails before COMMIT, nothing committed, and the
    locked_operation's next attempt (a new connection, a new cursor) reserves exactly once."""
    Stock.objects.create(sku="widget", available=5)
    with lockkit.locked() as scope:
        scope.get(Stock, pk="widget")  # the SELECT is compiled and kept
    attempts: list[int] = []

    @lockkit.locked_operation(retry=RetryPolicy(attempts=3))
    def reserve() -> int:
        scope = lockkit.current_scope()
        stock = scope.get(Stock, pk="widget")
        attempts.append(session_of("default"))
        if len(attempts) == 1:
            assert terminate("default", attempts[0])
        stock.available -= 1
        scope.save_with_commit(stock, update_fields=["available"])
        return stock.available

    assert reserve() == 4
    assert len(attempts) == 2
    assert attempts[1] != attempts[0]
    assert Stock.objects.get(pk="widget").available == 4
    with lockkit.locked() as scope:  # the next scope on the connection works
        stock = scope.get(Stock, pk="widget")
        stock.available = 3
        scope.save_with_commit(stock)
    assert Stock.objects.get(pk="widget").available == 3
    assert connection.execute_wrappers == []
