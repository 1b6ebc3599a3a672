"""A lost reply to ``UPDATE ...; COMMIT`` (``locked_update``'s second message) is resolved, never guessed.

A ``FaultProxy`` between Django and the server acts on the message that ends with ``COMMIT``: ``deliver`` lets the
server commit and cuts the reply, ``abort`` never forwards it (the server rolls back), ``hold`` keeps the server's
transaction open while the client looks for the outcome. A session terminated between the two messages (inside
``change()``) fails before COMMIT and is retried. Each time the next call in the same process works.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connections
from django.db.models import F

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.testing import ThreadCall, in_thread
from lockkit_harness.proxy import Action, FaultProxy
from lockkit_harness.sessions import session_of, terminate
from lockkit_tests.models import Stock
from lockkit_tests.support.faultkit import final_status

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "proxied"])


class Sale:
    """``locked_update`` selling one widget on ``alias``, arming ``proxy`` inside the first call of ``change()``."""

    def __init__(self, alias: str, proxy: FaultProxy, action: Action | None, **policy: Any) -> None:
        self.alias = alias
        self.proxy = proxy
        self.action = action
        self.seen: list[int] = []  # the value of the row each call of change() was given
        self.events: list[RetryEvent] = []
        self.retry = RetryPolicy(before_retry=self.events.append, **policy)

    def change(self, row: Stock) -> dict[str, int]:
        self.seen.append(row.available)
        if self.action is not None and len(self.seen) == 1:
            self.proxy.arm(self.action)  # acts on the next COMMIT: this attempt's ``UPDATE ...; COMMIT``
        return {"available": row.available - 1}

    def __call__(self) -> Stock:
        queryset = Stock.objects.using(self.alias).filter(sku="widget")
        return lockkit.locked_update(queryset, self.change, lock_timeout=5, retry=self.retry)


def _available() -> int:
    return Stock.objects.get(sku="widget").available


def test_a_lost_reply_of_a_message_that_committed_returns_the_row_as_written(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    sale = Sale(alias, proxy, "deliver")
    row = sale()
    assert proxy.cuts["deliver"] == 1  # the reply really was cut
    assert (row.sku, row.available, row._state.db) == ("widget", 4, alias)
    assert sale.seen == [5]  # change() called once
    assert sale.events == []  # resolved as committed: not retried
    assert _available() == 4
    again = Sale(alias, proxy, None)
    assert again().available == 3  # the next call in the same process works
    assert again.seen == [4]
    assert _available() == 3


def test_a_lost_message_that_never_arrived_is_retried_once(through_proxy: tuple[str, FaultProxy]) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    sale = Sale(alias, proxy, "abort")
    assert sale().available == 4
    assert proxy.cuts["abort"] == 1
    assert sale.seen == [5, 5]  # the retry decided again, on the row the first attempt did not change
    assert [(e.attempt, e.failure) for e in sale.events] == [(1, Failure.CONNECTION_LOST)]
    assert _available() == 4  # one decrement only
    assert Sale(alias, proxy, None)().available == 3
    assert _available() == 3


def test_an_undecided_message_raises_commit_outcome_unknown(through_proxy: tuple[str, FaultProxy]) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    # A short budget: the held transaction stays "in progress" for as long as the client asks.
    sale = Sale(alias, proxy, "hold", reconnect_within=1.0)
    with pytest.raises(lockkit.CommitOutcomeUnknown) as caught:
        sale()
    assert proxy.cuts["hold"] == 1
    assert type(caught.value.xid) is int
    assert caught.value.alias == alias
    assert sale.seen == [5]  # never retried blindly
    assert sale.events == []
    proxy.release_held()  # the held transaction ends without its COMMIT: rolled back
    assert final_status("default", caught.value.xid) == "aborted"
    assert _available() == 5  # the row is unchanged
    assert Sale(alias, proxy, None)().available == 4  # the next call works
    assert _available() == 4


def test_a_session_terminated_between_the_two_messages_is_retried_and_writes_once() -> None:
    """``change()`` ends its own session from another connection: ``UPDATE ...; COMMIT`` goes to a dead session,
    nothing commits, and the retry (a new connection) decrements once."""
    Stock.objects.create(sku="widget", available=5)
    sessions: list[int] = []
    seen: list[int] = []
    events: list[RetryEvent] = []

    def change(row: Stock) -> dict[str, int]:
        seen.append(row.available)
        sessions.append(session_of("default"))
        if len(seen) == 1:
            # A connection of its own (not this thread's "default"), so locked_update does not refuse it.
            assert terminate("default", sessions[0])
        return {"available": row.available - 1}

    row = lockkit.locked_update(
        Stock.objects.filter(sku="widget"), change, retry=RetryPolicy(before_retry=events.append)
    )
    assert row.available == 4
    assert seen == [5, 5]
    assert sessions[1] != sessions[0]  # the retry ran on a new session
    assert [(e.attempt, e.failure) for e in events] == [(1, Failure.CONNECTION_LOST)]
    assert _available() == 4  # written once
    assert lockkit.locked_update(Stock.objects.filter(sku="widget"), change).available == 3
    assert _available() == 3
    assert connections["default"].execute_wrappers == []


def test_a_lost_reply_that_committed_returns_the_row_this_call_wrote_not_a_later_writer_s(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    """Another session waits for the row and adds 100 once this call's commit frees it: the lost reply is resolved
    as committed after that, and the call still returns what it wrote (found by a review: it read the row again)."""
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    later: list[ThreadCall[int]] = []

    def add_100() -> int:
        return Stock.objects.filter(sku="widget").update(available=F("available") + 100)

    def change(row: Stock) -> dict[str, int]:
        if not later:
            proxy.arm("deliver")
            later.append(in_thread(add_100))
            # Observed on the direct alias (this call's own is refused inside change()): the writer waits.
            with connections["default"].cursor() as cursor:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND datname = current_database()"
                    )
                    if cursor.fetchone()[0] >= 1:
                        break
                else:
                    raise AssertionError("the other writer never waited for the row")
        return {"available": row.available - 1}

    queryset = Stock.objects.using(alias).filter(sku="widget")
    row = lockkit.locked_update(queryset, change, lock_timeout=5)
    assert proxy.cuts["deliver"] == 1
    assert later[0].result(10) == 1  # the later writer's UPDATE went through
    assert row.available == 4  # what this call wrote
    assert _available() == 104


def test_two_sessions_terminated_in_one_call_are_both_decided_by_the_server() -> None:
    """On a connection that served a call before, two attempts in a row lose their session inside ``change()``:
    each lost ``UPDATE ...; COMMIT`` is decided by the server that had it (found by a review: the second one,
    on a new connection, had no server to ask and was reported ``CommitOutcomeUnknown``)."""
    Stock.objects.create(sku="widget", available=5)
    queryset = Stock.objects.filter(sku="widget")
    assert lockkit.locked_update(queryset, lambda row: {"available": row.available - 1}).available == 4
    seen: list[int] = []
    sessions: list[int] = []
    events: list[RetryEvent] = []

    def change(row: Stock) -> dict[str, int]:
        seen.append(row.available)
        sessions.append(session_of("default"))
        if len(seen) <= 2:
            assert terminate("default", sessions[-1])
        return {"available": row.available - 1}

    row = lockkit.locked_update(queryset, change, retry=RetryPolicy(attempts=5, before_retry=events.append))
    assert row.available == 3
    assert seen == [4, 4, 4]
    assert len(set(sessions)) == 3
    assert [(e.attempt, e.failure) for e in events] == [
        (1, Failure.CONNECTION_LOST),
        (2, Failure.CONNECTION_LOST),
    ]
    assert _available() == 3  # written once
    assert lockkit.locked_update(queryset, lambda row: {"available": row.available - 1}).available == 2


def test_a_lost_reply_that_committed_returns_what_was_stored_not_what_change_did_to_its_row(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    """``change()`` sets an attribute it does not return and returns a value as text: the row returned after the
    lost reply is the row read, with the returned field as the field converts it (found by a second review: the
    instance change() had changed, with the raw text)."""
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)

    def change(row: Stock) -> dict[str, str]:
        proxy.arm("deliver")
        row.sku = "scratch"  # its key, not returned: not written, and the row locked is the row written
        return {"available": "3"}

    events: list[RetryEvent] = []
    retry = RetryPolicy(before_retry=events.append)
    row = lockkit.locked_update(
        Stock.objects.using(alias).filter(sku="widget"), change, lock_timeout=5, retry=retry
    )
    assert proxy.cuts["deliver"] == 1
    assert events == []
    assert (row.sku, row.available) == ("widget", 3)
    assert _available() == 3
    assert Stock.objects.get().sku == "widget"
