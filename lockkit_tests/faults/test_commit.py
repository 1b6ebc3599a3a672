"""A COMMIT whose reply never arrives is resolved, not guessed (issue 11, item 3).

A ``FaultProxy`` sits between Django and the server. Armed inside the operation's body, it acts on that
attempt's COMMIT: ``deliver`` lets the server commit and cuts the reply, ``abort`` never forwards it (the server
rolls back when the connection closes), ``hold`` keeps the server's transaction open while the client looks for
the outcome.
"""

from __future__ import annotations

import time

import pytest
from django.db import connections

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.claims import claim_next, held_by
from lockkit.testing import in_thread
from lockkit_harness.proxy import FaultProxy
from lockkit_tests.models import Item, Job, Stock
from lockkit_tests.support.faultkit import final_status, proxied
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON


def _sale(alias: str, proxy: FaultProxy, action: str | None, *, on_attempt: int = 1):  # type: ignore[no-untyped-def]
    """A locked operation selling one widget and recording the sale (one ``Item`` row) and its callback."""
    record: dict[str, list[object]] = {"attempts": [], "callbacks": [], "events": []}

    @lockkit.locked_operation(alias, retry=RetryPolicy(before_retry=record["events"].append))
    def sell() -> int:
        scope = lockkit.current_scope()
        record["attempts"].append(scope.attempt)
        row = scope.get(Stock, pk="widget")
        row.available -= 1
        row.save(using=alias)
        Item.objects.using(alias).create(name="sale")
        scope.on_commit(lambda: record["callbacks"].append("sent"))
        if action is not None and scope.attempt == on_attempt:
            proxy.arm(action)  # type: ignore[arg-type]
        return row.available

    return sell, record


pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "proxied"])


def test_lost_reply_of_a_commit_that_happened_returns_the_result_and_runs_callbacks_once(
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
    assert Item.objects.count() == 1
    assert Stock.objects.get().available == 4


def test_lost_reply_of_a_commit_that_never_happened_is_retried_once(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    sell, record = _sale(alias, proxy, "abort")
    assert sell() == 4
    assert proxy.cuts["abort"] == 1
    assert record["attempts"] == [1, 2]
    assert record["callbacks"] == ["sent"]
    events = record["events"]
    assert [e.failure for e in events if isinstance(e, RetryEvent)] == [Failure.CONNECTION_LOST]
    assert Item.objects.count() == 1
    assert Stock.objects.get().available == 4


def test_an_undecided_commit_raises_commit_outcome_unknown_with_the_xid(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    sell, record = _sale(alias, proxy, "hold")
    with pytest.raises(lockkit.CommitOutcomeUnknown) as caught:
        sell()
    assert isinstance(caught.value, lockkit.ConnectionLost)
    assert isinstance(caught.value.xid, int)
    assert caught.value.alias == alias
    assert record["attempts"] == [1]  # never retried blindly
    assert record["callbacks"] == []
    proxy.release_held()  # the held server transaction ends without its COMMIT: rolled back
    assert final_status("default", caught.value.xid) == "aborted"
    assert Item.objects.count() == 0


def test_an_unreachable_server_after_a_lost_commit_raises_commit_outcome_unknown(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    sell, record = _sale(alias, proxy, "deliver")
    connections[alias].ensure_connection()
    proxy.refuse_new = True  # the open connection stays; reconnecting to ask for the outcome fails
    with pytest.raises(lockkit.CommitOutcomeUnknown) as caught:
        sell()
    proxy.refuse_new = False
    assert record["attempts"] == [1]
    assert record["callbacks"] == []
    assert Item.objects.count() == 1  # it did commit: exactly why the caller must not be told "failed"
    assert final_status("default", caught.value.xid) == "committed"


def test_locked_without_retries_resolves_too(through_proxy: tuple[str, FaultProxy]) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    callbacks: list[str] = []
    with lockkit.locked(alias) as scope:
        scope.get(Stock, pk="widget")
        Item.objects.using(alias).create(name="committed")
        scope.on_commit(lambda: callbacks.append("sent"))
        proxy.arm("deliver")
    assert callbacks == ["sent"]  # resolved as committed: no error, callbacks once
    with pytest.raises(lockkit.ConnectionLost) as caught:
        with lockkit.locked(alias) as scope:
            scope.get(Stock, pk="widget")
            Item.objects.using(alias).create(name="aborted")
            scope.on_commit(lambda: callbacks.append("never"))
            proxy.arm("abort")
    assert not isinstance(caught.value, lockkit.CommitOutcomeUnknown)  # the outcome is known: rolled back
    assert callbacks == ["sent"]
    assert list(Item.objects.values_list("name", flat=True)) == ["committed"]


def test_a_lost_claim_reply_leaves_a_claim_that_held_by_finds(through_proxy: tuple[str, FaultProxy]) -> None:
    alias, proxy = through_proxy
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    connections[alias].ensure_connection()  # opened before the proxy refuses new connections
    proxy.arm("deliver")
    proxy.refuse_new = True
    with pytest.raises(lockkit.CommitOutcomeUnknown):
        claim_next(Job.objects.using(alias).filter(name="a"), worker="w1", lease=60)
    proxy.refuse_new = False
    orphans = held_by(Job.objects.all(), worker="w1")  # after a restart or a lost reply: what do I hold?
    assert [(o.pk, o.worker) for o in orphans] == [(Job.objects.get(name="a").pk, "w1")]
    assert orphans[0].token == Job.objects.get(name="a").claim_token


@pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON)
@pytest.mark.django_db(transaction=True, databases=["default", "mariadb", "proxied_mariadb"])
def test_mariadb_cannot_resolve_a_lost_commit_and_says_so() -> None:
    Stock.objects.using("mariadb").create(sku="widget", available=5)
    with proxied("mariadb", "proxied_mariadb") as (alias, proxy):
        sell, record = _sale(alias, proxy, "deliver")
        with pytest.raises(lockkit.CommitOutcomeUnknown) as caught:
            sell()
        assert caught.value.xid is None
        assert record["attempts"] == [1]
        assert record["callbacks"] == []
    assert Item.objects.using("mariadb").count() == 1  # committed, and reported as unknown, never as failed


def _outage(proxy: FaultProxy, seconds: float) -> None:
    """Refuse new connections from the COMMIT's cut for ``seconds`` (a server restart that long), then accept."""
    deadline = time.monotonic() + 30
    while proxy.cuts["deliver"] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(seconds)  # the fault's duration, not a synchronisation
    proxy.refuse_new = False


@pytest.mark.parametrize(("reconnect_within", "outcome"), [(15.0, "committed"), (0.5, "unknown")])
def test_a_lost_commit_is_resolved_for_as_long_as_the_policy_reconnects(
    through_proxy: tuple[str, FaultProxy], reconnect_within: float, outcome: str
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="widget", available=5)
    record: dict[str, list[object]] = {"callbacks": []}

    @lockkit.locked_operation(alias, retry=RetryPolicy(reconnect_within=reconnect_within))
    def sell() -> int:
        scope = lockkit.current_scope()
        row = scope.get(Stock, pk="widget")
        row.available -= 1
        row.save(using=alias)
        scope.on_commit(lambda: record["callbacks"].append("sent"))
        proxy.refuse_new = True  # the outage starts with the cut: reconnecting fails until it ends
        proxy.arm("deliver")
        return row.available

    connections[alias].ensure_connection()
    outage = in_thread(_outage, proxy, 4.0)  # longer than the fixed 3 s lockkit used to resolve for
    if outcome == "committed":
        assert sell() == 4
        assert record["callbacks"] == ["sent"]
    else:
        with pytest.raises(lockkit.CommitOutcomeUnknown):
            sell()
        assert record["callbacks"] == []
    outage.result(30)
    assert Stock.objects.get().available == 4  # it committed either way: only the budget differs
