"""``lockkit.guarded_update``: the queryset's filter guards one ``UPDATE ... RETURNING``, the updated rows come back.

On PostgreSQL outside a transaction it is one message (``BEGIN; set_config; UPDATE ... RETURNING; COMMIT``): one
round trip, a lock timeout and a deadlock classified (the deadlock retried), a lost reply reported as
``CommitOutcomeUnknown`` and the next call working. Inside ``atomic()`` it is part of the caller's transaction. On
MariaDB it locks, updates and re-reads in a scope; on SQLite it is ``UPDATE ... RETURNING`` in a scope. A hot row
is never oversold by concurrent callers. Bad input is refused before any SQL.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.db.models import F, Value
from django.db.models.expressions import RawSQL
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.testing import backend_pid, hold_lock, in_thread, run_concurrently, wait_until_blocked
from lockkit_harness.proxy import Action, FaultProxy
from lockkit_tests.models import Owner, Stock, UrgentJob
from lockkit_tests.support.vendors import vendor_params

JOIN = 30.0
VENDORS = [
    *vendor_params(),
    pytest.param(
        "sqlite",
        id="sqlite",
        marks=[pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])],
    ),
]


def _take(alias: str, sku: str, quantity: int) -> list[Stock]:
    return lockkit.guarded_update(
        Stock.objects.using(alias).filter(pk=sku, available__gte=quantity),
        available=F("available") - quantity,
    )


@pytest.mark.parametrize("alias", VENDORS)
def test_the_updated_rows_come_back_with_their_new_values(alias: str) -> None:
    Stock.objects.using(alias).bulk_create([Stock(sku="a", available=5), Stock(sku="b", available=1)])
    (row,) = _take(alias, "a", 2)
    assert isinstance(row, Stock)
    assert (row.sku, row.available, row._state.db, row._state.adding) == ("a", 3, alias, False)
    assert _take(alias, "b", 2) == []  # the guard matched nothing: out of stock, nothing written
    both = lockkit.guarded_update(Stock.objects.using(alias).all(), available=Value(7))
    assert sorted((s.sku, s.available) for s in both) == [("a", 7), ("b", 7)]
    assert dict(Stock.objects.using(alias).values_list("sku", "available")) == {"a": 7, "b": 7}
    assert lockkit.guarded_update(Stock.objects.using(alias).filter(pk__in=[]), available=1) == []


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_outside_a_transaction_it_is_one_message() -> None:
    Stock.objects.create(sku="a", available=5)
    with CaptureQueriesContext(connection) as queries:
        (row,) = _take("default", "a", 1)
    (sent,) = [query["sql"] for query in queries.captured_queries]  # one round trip, nothing else
    assert sent.startswith("BEGIN; SELECT set_config('lock_timeout', '5000ms', true); UPDATE "), sent
    assert " RETURNING " in sent
    assert sent.endswith("; COMMIT"), sent
    assert row.available == 4
    assert Stock.objects.get().available == 4
    raw: Any = connection.connection
    assert raw.info.transaction_status == 0  # idle: committed, no transaction left open
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        assert cursor.fetchone() == ("0",)  # the call's timeout ended with its transaction


@pytest.mark.django_db(transaction=True)
def test_a_held_row_and_a_lock_timeout_raise_lock_timeout_with_the_row_unchanged() -> None:
    Stock.objects.create(sku="a", available=5)
    queryset = Stock.objects.filter(pk="a", available__gte=1)
    with hold_lock(Stock.objects.filter(pk="a"), timeout=20):
        with pytest.raises(lockkit.LockTimeout) as raised:
            lockkit.guarded_update(queryset, available=F("available") - 1, lock_timeout=0.2, retry=None)
    assert (raised.value.sqlstate, raised.value.alias, raised.value.attempts) == ("55P03", "default", 1)
    assert Stock.objects.get().available == 5
    (row,) = lockkit.guarded_update(queryset, available=F("available") - 1)  # the next call works
    assert row.available == 4


@pytest.mark.django_db(transaction=True)
def test_a_statement_timeout_raises_statement_timeout() -> None:
    Stock.objects.create(sku="a", available=5)
    slow = RawSQL("(SELECT 1 FROM pg_sleep(2))", [])
    with pytest.raises(lockkit.StatementTimeout) as raised:
        lockkit.guarded_update(
            Stock.objects.filter(pk="a"), available=slow, statement_timeout=0.1, retry=None
        )
    assert raised.value.sqlstate == "57014"
    assert Stock.objects.get().available == 5


@pytest.mark.django_db(transaction=True)
def test_a_deadlock_against_a_locked_transaction_is_retried() -> None:
    """The guarded update locks a then waits for b; the other transaction, holding b, then asks for a.

    Which session of a cycle is the victim is the one whose deadlock check (``deadlock_timeout`` after it began to
    wait) runs while the cycle exists. The test databases' 100 ms would let a busy machine start the other
    transaction's wait after the updater's check, or let a retried update close the cycle again and the other
    transaction's check find it: here the updater's session checks after 2 s, and the other transaction never
    within the test (60 s, for its transaction only). Both settings are superuser-only, as the test databases' is.
    """
    Stock.objects.bulk_create([Stock(sku="a", available=5), Stock(sku="b", available=5)])
    events: list[RetryEvent] = []
    holding, go = threading.Event(), threading.Event()
    pids: list[int] = []

    @lockkit.locked_operation(lock_timeout=20, retry=None)
    def other() -> int:
        scope = lockkit.current_scope()
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL deadlock_timeout = '60s'")
        scope.get(Stock, pk="b")
        pids.append(backend_pid())
        holding.set()
        assert go.wait(JOIN)
        scope.get(Stock, pk="a")  # closes the cycle
        return scope.attempt

    def update() -> Any:
        with connection.cursor() as cursor:  # this thread's own session, for every attempt
            cursor.execute("SET deadlock_timeout = '2s'")
        return lockkit.guarded_update(
            Stock.objects.filter(pk__in=["a", "b"]).order_by(),
            available=F("available") - 1,
            lock_timeout=20,
            retry=RetryPolicy(attempts=3, before_retry=events.append),
        )

    blocker = in_thread(other)
    assert holding.wait(JOIN)
    updater = in_thread(update)
    wait_until_blocked(pids[0], contenders=[updater], timeout=JOIN)  # it holds a and waits for b
    go.set()
    done = updater.outcome(timeout=JOIN)
    blocked = blocker.outcome(timeout=JOIN)
    # The updater's check finds the cycle: it is the victim, retried after the other transaction committed.
    assert blocked.error is None
    assert blocked.result == 1
    assert done.error is None, done.error
    assert sorted((s.sku, s.available) for s in done.result or []) == [("a", 4), ("b", 4)]
    # Retried at once, the update can take a again before the other transaction, woken by the rollback, does: the
    # same cycle may close once more (attempts=3 allows it), and the updater is its victim again.
    assert [(e.failure, e.sqlstate, e.attempt) for e in events] == [
        (Failure.DEADLOCK_DETECTED, "40P01", attempt) for attempt in range(1, len(events) + 1)
    ]
    assert 1 <= len(events) <= 2
    assert dict(Stock.objects.values_list("sku", "available")) == {"a": 4, "b": 4}


@pytest.mark.django_db(transaction=True)
def test_inside_atomic_it_joins_the_callers_transaction_and_rolls_back_with_it() -> None:
    Stock.objects.create(sku="a", available=5)
    with pytest.raises(RuntimeError), transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            (row,) = _take("default", "a", 2)
        assert row.available == 3
        assert not any(q["sql"].endswith("COMMIT") for q in queries.captured_queries)
        assert Stock.objects.get().available == 3  # visible in the caller's transaction
        raise RuntimeError("the caller rolls back")
    assert Stock.objects.get().available == 5


@pytest.mark.contention
@pytest.mark.parametrize("alias", vendor_params())
def test_a_hot_row_is_never_oversold_by_eight_concurrent_callers(alias: str) -> None:
    Stock.objects.using(alias).create(sku="hot", available=20)

    def buyer() -> int:
        bought = 0
        while _take(alias, "hot", 1):
            bought += 1
        return bought

    outcomes = run_concurrently(buyer, 8, timeout=JOIN, reraise=True)
    assert sum(o.result or 0 for o in outcomes) == 20  # every unit sold exactly once
    assert Stock.objects.using(alias).get().available == 0


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
@pytest.mark.parametrize(("action", "committed"), [("deliver", True), ("abort", False)])
def test_a_lost_reply_is_commit_outcome_unknown_and_the_next_call_works(
    through_proxy: tuple[str, FaultProxy], action: Action, committed: bool
) -> None:
    alias, proxy = through_proxy
    Stock.objects.create(sku="a", available=5)
    proxy.arm(action)  # deliver: it ran and committed, the reply is cut; abort: it never reached the server
    with pytest.raises(lockkit.CommitOutcomeUnknown) as raised:
        _take(alias, "a", 1)
    assert proxy.cuts[action] == 1
    assert raised.value.alias == alias
    assert Stock.objects.get().available == (4 if committed else 5)  # what the server really did
    (row,) = _take(alias, "a", 1)  # the next call in the same process works, on a new connection
    assert row.available == (3 if committed else 4)


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_bad_input_is_refused_before_any_sql() -> None:
    from lockkit_tests.core.test_locked_update import Doubled

    stock = Stock.objects.all()
    cases: list[tuple[type[BaseException], Any, dict[str, Any]]] = [
        (TypeError, Stock, {"available": 1}),
        (TypeError, [Stock(sku="a")], {"available": 1}),
        (ValueError, stock, {}),
        (ValueError, stock, {"missing": 1}),
        (ValueError, stock[:1], {"available": 1}),
        (ValueError, stock.distinct(), {"available": 1}),
        (ValueError, stock.annotate(twice=F("available") * 2), {"available": 1}),
        (ValueError, Owner.objects.all(), {"item": 1}),  # a reverse relation: not a column
        (ValueError, UrgentJob.objects.all(), {"name": "x"}),  # the parent's table (multi-table inheritance)
        (lockkit.AliasMismatch, stock.using("other"), {"available": 1, "using": "default"}),
        (ValueError, stock, {"available": 1, "lock_timeout": 0}),
        # Found by a review: the key changed on MariaDB and [] returned (rows read back by their old keys); a
        # GeneratedField dropped by Django's update() without a word ([] on PostgreSQL, "updated" on MariaDB).
        (ValueError, stock, {"sku": "zz"}),
        (ValueError, stock, {"pk": "zz"}),
        (ValueError, Doubled.objects.all(), {"doubled": 3}),
        (ValueError, Doubled.objects.all(), {"value": 5, "doubled": 3}),
        (TypeError, stock, {"available": 1, "retry": "twice"}),
    ]
    for conn in (connections["default"], connections["other"]):
        conn.ensure_connection()
    with (
        CaptureQueriesContext(connections["default"]) as queries,
        CaptureQueriesContext(connections["other"]) as other,
    ):
        for error, queryset, kwargs in cases:
            with pytest.raises(error):
                lockkit.guarded_update(queryset, **kwargs)
    assert queries.captured_queries == []
    assert other.captured_queries == []


@pytest.mark.parametrize("alias", VENDORS)
def test_a_multi_table_child_is_updated_and_returned_whole(alias: str) -> None:
    from lockkit_tests.models import PeerCountry

    country = PeerCountry.objects.using(alias).create(code="fr", name="France")
    (row,) = lockkit.guarded_update(PeerCountry.objects.using(alias).filter(code="fr"), name="République")
    assert (row.pk, row.code, row.name) == (country.pk, "fr", "République")
    assert PeerCountry.objects.using(alias).get(pk=country.pk).name == "République"
