"""An outage longer than the default 5 s: ``locked()`` (entering), claims, ``guarded_update``, ``locked_update`` and
``advisory_lock`` retry a refused connection
on one budget, the call's policy or ``settings.LOCKKIT["RETRY"]`` (its ``reconnect_within``).

The server is a throwaway cluster this module starts (``initdb`` + ``pg_ctl`` on a free port), stopped by the test
(it then refuses connections) and started again ``OUTAGE`` seconds later from a timer thread. The alias's
connection is closed before the outage, as a worker's is between calls, so that every call meets a server that
refuses connections.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import OperationalError, connections
from django.db.models import F

import lockkit
from lockkit import CommitOutcomeUnknown, ConnectionLost, Failure, RetryEvent, RetryPolicy
from lockkit.claims import Claim, claim_next
from lockkit.scopes.options import FROM_SETTINGS
from lockkit_harness.cluster import TempCluster, missing_binaries
from lockkit_tests.models import Job, Stock
from lockkit_tests.support.faultkit import create_tables, extra_alias

MISSING = missing_binaries()
ALIAS = "restartable"
JOIN = 60.0
OUTAGE = 7.0  # seconds the server refuses connections: longer than the default reconnect_within (5 s)
DEFAULT_BUDGET = 5.0

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=f"no throwaway cluster: {MISSING}"),
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS]),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[TempCluster]:
    with TempCluster() as started:
        yield started


@pytest.fixture
def alias(cluster: TempCluster) -> Iterator[str]:
    with extra_alias(ALIAS, "default", HOST="127.0.0.1", PORT=cluster.port, NAME="postgres", OPTIONS={}):
        with connections[ALIAS].cursor() as cursor:
            cursor.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        create_tables(ALIAS, Stock, Job)
        Stock.objects.using(ALIAS).create(sku="widget", available=10)
        Job.objects.using(ALIAS).create(name="first")
        Job.objects.using(ALIAS).create(name="second")
        yield ALIAS
        connections[ALIAS].close()


@dataclass(frozen=True)
class Entry:
    """An entry point called during an outage, and the check of what it did."""

    name: str
    call: Callable[[str, Any], Any]  # (alias, the call's retry option or FROM_SETTINGS) -> result
    check: Callable[[str, Any, int], None]  # (alias, result, how many calls succeeded so far)


def _claim(alias: str, retry: Any) -> list[Claim]:
    queryset = Job.objects.using(alias).filter(state="pending").order_by("pk")
    return claim_next(queryset, worker="w1", lease=60, set={"state": "running"})


def _claimed(alias: str, result: list[Claim], done: int) -> None:
    names = ["first", "second"]
    (claim,) = result
    job = Job.objects.using(alias).get(pk=claim.pk)
    assert (job.name, job.state, job.claimed_by, job.claim_token) == (
        names[done - 1],
        "running",
        "w1",
        claim.token,
    )
    assert Job.objects.using(alias).filter(state="running").count() == done


def _take(alias: str, retry: Any) -> list[Stock]:
    queryset = Stock.objects.using(alias).filter(pk="widget", available__gte=3)
    return lockkit.guarded_update(queryset, available=F("available") - 3, retry=retry)


def _taken(alias: str, result: list[Stock], done: int) -> None:
    (row,) = result
    assert (row.pk, row.available) == ("widget", 10 - 3 * done)
    assert Stock.objects.using(alias).get(pk="widget").available == 10 - 3 * done


def _take_under_lock(alias: str, retry: Any) -> tuple[int | None, int]:
    with lockkit.advisory_lock("outage", using=alias) as held:
        assert held.alias == alias
        Stock.objects.using(alias).filter(pk="widget").update(available=F("available") - 3)
        return held.pid, Stock.objects.using(alias).get(pk="widget").available


def _taken_under_lock(alias: str, result: tuple[int | None, int], done: int) -> None:
    pid, available = result
    assert pid is not None
    assert available == 10 - 3 * done
    assert Stock.objects.using(alias).get(pk="widget").available == 10 - 3 * done
    with connections[alias].cursor() as cursor:  # the lock ended with its transaction
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        assert cursor.fetchone() == (0,)


def _reserve(alias: str, retry: Any) -> Stock:
    queryset = Stock.objects.using(alias).filter(pk="widget")
    return lockkit.locked_update(queryset, lambda row: {"available": row.available - 3}, retry=retry)


def _reserved(alias: str, result: Stock, done: int) -> None:
    assert (result.pk, result.available) == ("widget", 10 - 3 * done)
    assert Stock.objects.using(alias).get(pk="widget").available == 10 - 3 * done


def _reserve_in_scope(alias: str, retry: Any) -> int:
    with lockkit.locked(alias) as scope:
        stock = scope.get(Stock, pk="widget")
        stock.available -= 3
        stock.save(update_fields=["available"])
        return stock.available


def _reserved_in_scope(alias: str, result: int, done: int) -> None:
    assert result == 10 - 3 * done
    assert Stock.objects.using(alias).get(pk="widget").available == 10 - 3 * done


ENTRIES = [
    pytest.param(Entry("locked", _reserve_in_scope, _reserved_in_scope), id="locked"),
    pytest.param(Entry("claim_next", _claim, _claimed), id="claim_next"),
    pytest.param(Entry("guarded_update", _take, _taken), id="guarded_update"),
    pytest.param(Entry("locked_update", _reserve, _reserved), id="locked_update"),
    pytest.param(Entry("advisory_lock", _take_under_lock, _taken_under_lock), id="advisory_lock"),
]


class Outage:
    """Stops the server, and starts it again from a timer thread; the fixture makes sure it is back after the test."""

    def __init__(self, cluster: TempCluster) -> None:
        self.cluster = cluster
        self.timer: threading.Timer | None = None

    def begin(self, seconds: float | None, *, keep_connection: bool = False) -> float:
        """Stop the server; start it again ``seconds`` later (``None``: at ``end()``); return when it stopped.

        With ``keep_connection`` this thread's connection stays open through the stop: the next call meets a dead one.
        """
        if not keep_connection:
            connections[ALIAS].close()
        self.cluster.stop("fast")
        stopped = time.monotonic()
        if seconds is not None:
            self.timer = threading.Timer(seconds, self.cluster.start)
            self.timer.daemon = True
            self.timer.start()
        return stopped

    def end(self) -> None:
        """Return once the server accepts connections again."""
        if self.timer is not None:
            self.timer.join(JOIN)
            assert not self.timer.is_alive()
            self.timer = None
        if not self.cluster.running():
            self.cluster.start()
        assert self.cluster.running()


@pytest.fixture
def outage(cluster: TempCluster, alias: str) -> Iterator[Outage]:
    stopping = Outage(cluster)
    try:
        yield stopping
    finally:
        stopping.end()


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_call_rides_out_an_outage_within_the_settings_reconnect_within(
    outage: Outage, alias: str, settings: Any, entry: Entry
) -> None:
    events: list[RetryEvent] = []
    settings.LOCKKIT = {"RETRY": {"reconnect_within": 30, "before_retry": events.append}}
    entry.check(alias, entry.call(alias, FROM_SETTINGS), 1)  # the server is up: a plain call
    stopped = outage.begin(OUTAGE)
    result = entry.call(alias, FROM_SETTINGS)  # started while the server refuses connections
    took = time.monotonic() - stopped
    outage.end()
    assert took >= OUTAGE  # it succeeded only once the server was back, after longer than the default budget
    entry.check(alias, result, 2)
    assert events, "no retry: the call never met the outage"
    assert {event.failure for event in events} == {Failure.CONNECTION_LOST}
    assert {event.alias for event in events} == {alias}


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_default_budget_gives_up_with_connection_lost_and_the_next_call_works(
    outage: Outage, alias: str, entry: Entry
) -> None:
    stopped = outage.begin(OUTAGE)
    with pytest.raises(ConnectionLost) as info:
        entry.call(alias, FROM_SETTINGS)
    took = time.monotonic() - stopped
    assert DEFAULT_BUDGET - 0.1 <= took < OUTAGE  # gave up after 5 s, while the server still refused
    assert not isinstance(info.value, CommitOutcomeUnknown)  # nothing was sent
    assert isinstance(info.value.__cause__, OperationalError)  # typed, from Django's error
    assert info.value.alias == alias
    assert info.value.attempts > 2  # retried within the budget
    outage.end()
    entry.check(alias, entry.call(alias, FROM_SETTINGS), 1)  # the next call reconnects


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_default_budget_is_spent_once_when_the_kept_connection_died(
    outage: Outage, alias: str, entry: Entry
) -> None:
    """The connection of an earlier call is still open when the server stops: the call gives up after one
    ``reconnect_within`` (found by a review: ``advisory_lock`` met the refusal in the scope it opens, which waited
    a budget of its own before the call's began: twice the setting)."""
    entry.check(alias, entry.call(alias, FROM_SETTINGS), 1)
    stopped = outage.begin(OUTAGE, keep_connection=True)
    with pytest.raises(ConnectionLost):
        entry.call(alias, FROM_SETTINGS)
    took = time.monotonic() - stopped
    assert DEFAULT_BUDGET - 0.1 <= took < OUTAGE  # gave up after 5 s, while the server still refused
    outage.end()
    entry.check(alias, entry.call(alias, FROM_SETTINGS), 2)  # the next call reconnects


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_refused_connection_is_a_typed_connection_lost(
    outage: Outage, alias: str, settings: Any, entry: Entry
) -> None:
    settings.LOCKKIT = {"RETRY": None}  # no retries: one attempt, whose failure is typed
    outage.begin(None)
    with pytest.raises(ConnectionLost) as info:
        entry.call(alias, FROM_SETTINGS)
    assert isinstance(info.value.__cause__, OperationalError)
    assert not isinstance(info.value, CommitOutcomeUnknown)
    assert info.value.attempts == 1
    outage.end()
    entry.check(alias, entry.call(alias, FROM_SETTINGS), 1)


def test_guarded_update_rides_out_an_outage_on_its_own_policy(
    outage: Outage, alias: str, settings: Any
) -> None:
    settings.LOCKKIT = {"RETRY": {"reconnect_within": 0.2}}
    stopped = outage.begin(OUTAGE)
    result = _take(alias, RetryPolicy(reconnect_within=30))  # the call's policy, not the settings'
    took = time.monotonic() - stopped
    outage.end()
    assert took >= OUTAGE
    _taken(alias, result, 1)


def test_guarded_update_gives_up_on_its_own_policy_before_the_settings_budget(
    outage: Outage, alias: str, settings: Any
) -> None:
    settings.LOCKKIT = {"RETRY": {"reconnect_within": 30}}
    stopped = outage.begin(None)
    with pytest.raises(ConnectionLost):
        _take(alias, RetryPolicy(reconnect_within=0.5))
    took = time.monotonic() - stopped
    outage.end()
    assert 0.5 <= took < DEFAULT_BUDGET
    _taken(alias, _take(alias, FROM_SETTINGS), 1)


def test_a_claims_reply_lost_in_the_outage_is_worked_on_for_the_settings_reconnect_within(
    outage: Outage, alias: str, settings: Any
) -> None:
    """The connection is left open when the server stops: the claim is sent on it, and its reply is lost.

    The call then waits for the server to say that the session that sent it has ended, for ``reconnect_within``
    (30 s here, not the default 5 s), and finds out from the rows that it claimed nothing: it claims again.
    """
    settings.LOCKKIT = {"RETRY": {"reconnect_within": 30}}
    _claimed(alias, _claim(alias, FROM_SETTINGS), 1)
    assert connections[alias].connection is not None  # kept open across the outage
    outage.cluster.stop("fast")
    stopped = time.monotonic()
    outage.timer = threading.Timer(OUTAGE, outage.cluster.start)
    outage.timer.start()
    result = _claim(alias, FROM_SETTINGS)
    took = time.monotonic() - stopped
    outage.end()
    assert took >= OUTAGE
    _claimed(alias, result, 2)
