"""``lockkit.locked_update``: lock one row, decide in Python, write, commit; the whole call retried as one.

On PostgreSQL outside a transaction it is two messages (the opening with the locking ``SELECT``, then ``UPDATE ...;
COMMIT``); inside ``atomic()``, on MariaDB and on SQLite it is a locked scope with the same results. ``change()``
raising, touching the database or breaking a constraint leaves nothing written and the next call working.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from django.db import IntegrityError, ProgrammingError, connection, connections, models, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.testing import hold_lock, in_thread, wait_until_blocked
from lockkit_tests.models import Item, PairStock, Stock, StockProxy
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


class OutOfStock(Exception):
    pass


def _reserve(quantity: int) -> Any:
    def change(row: Stock) -> dict[str, int]:
        if row.available < quantity:
            raise OutOfStock(row.sku)
        return {"available": row.available - quantity}

    return change


def _idle(alias: str) -> bool:
    """No transaction is left open on the alias's connection (Django's and the server's view)."""
    conn = connections[alias]
    if conn.in_atomic_block:
        return False
    if conn.vendor == "postgresql" and conn.connection is not None:
        from psycopg import pq

        return bool(conn.connection.info.transaction_status == pq.TransactionStatus.IDLE)
    return True


@pytest.mark.parametrize("alias", VENDORS)
def test_the_row_is_written_and_returned_as_written(alias: str) -> None:
    Stock.objects.using(alias).bulk_create([Stock(sku="a", available=5), Stock(sku="b", available=1)])
    row = lockkit.locked_update(Stock.objects.using(alias).filter(sku="a"), _reserve(2), lock_timeout=3)
    assert isinstance(row, Stock)
    assert (row.sku, row.available, row._state.db, row._state.adding) == ("a", 3, alias, False)
    assert Stock.objects.using(alias).get(sku="a").available == 3
    assert Stock.objects.using(alias).get(sku="b").available == 1  # only the locked row
    assert _idle(alias)


@pytest.mark.parametrize("alias", VENDORS)
def test_exactly_one_row_or_the_models_own_errors(alias: str) -> None:
    Stock.objects.using(alias).bulk_create([Stock(sku="a", available=5), Stock(sku="b", available=5)])
    calls: list[str] = []

    def change(row: Stock) -> dict[str, int]:
        calls.append(row.sku)
        return {"available": 0}

    with pytest.raises(Stock.DoesNotExist):
        lockkit.locked_update(Stock.objects.using(alias).filter(sku="zzz"), change)
    with pytest.raises(Stock.MultipleObjectsReturned):
        lockkit.locked_update(Stock.objects.using(alias).all(), change)
    with pytest.raises(Stock.DoesNotExist):
        lockkit.locked_update(Stock.objects.using(alias).filter(sku__in=[]), change)
    assert calls == []
    assert sorted(Stock.objects.using(alias).values_list("available", flat=True)) == [5, 5]
    assert _idle(alias)


@pytest.mark.parametrize("alias", VENDORS)
def test_a_domain_error_rolls_back_is_not_retried_and_releases_the_row(alias: str) -> None:
    Stock.objects.using(alias).create(sku="a", available=1)
    seen: list[int] = []

    def change(row: Stock) -> dict[str, int]:
        seen.append(row.available)
        raise OutOfStock(row.sku)

    with pytest.raises(OutOfStock):
        lockkit.locked_update(
            Stock.objects.using(alias).filter(sku="a"),
            change,
            retry=RetryPolicy(
                attempts=5,
                retry_on={Failure.LOCK_TIMEOUT, Failure.DEADLOCK_DETECTED, Failure.CONNECTION_LOST},
            ),
        )
    assert seen == [1]  # one call of change(): a domain error is never retried
    assert _idle(alias)
    # The row lock is gone: a NOWAIT lock of the row from a scope succeeds at once (SQLite locks the database).
    with lockkit.locked(alias, nowait=alias != "sqlite") as scope:
        assert scope.get(Stock, pk="a").available == 1


@pytest.mark.parametrize("alias", VENDORS)
def test_change_must_not_touch_the_database(alias: str) -> None:
    Stock.objects.using(alias).bulk_create([Stock(sku="a", available=5), Stock(sku="b", available=5)])

    def sneaky(row: Stock) -> dict[str, int]:
        Stock.objects.using(alias).filter(sku="b").update(available=0)
        return {"available": 1}

    def swallowing(row: Stock) -> dict[str, int]:
        with contextlib.suppress(lockkit.QueryInChange):
            Stock.objects.using(alias).get(sku="b")
        return {"available": 1}

    def in_atomic(row: Stock) -> dict[str, int]:
        # On PostgreSQL's two-message path the row's transaction is lockkit's: atomic() itself fails (found by a
        # review: a raw ProgrammingError there, QueryInChange elsewhere).
        with transaction.atomic(using=alias):
            Stock.objects.using(alias).filter(sku="b").update(available=0)
        return {"available": 1}

    def in_lockkit(row: Stock) -> dict[str, int]:
        lockkit.guarded_update(Stock.objects.using(alias).filter(sku="b"), available=0)
        return {"available": 1}

    def closing(row: Stock) -> dict[str, int]:
        # Found by a review: reported as a lost COMMIT (PostgreSQL), a raw driver error (MariaDB, SQLite: the
        # scope's atomic() keeps the closed connection until it ends).
        connections[alias].close()
        return {"available": 1}

    for change in (sneaky, swallowing, in_atomic, in_lockkit, closing):
        with pytest.raises(lockkit.QueryInChange, match="change"):
            lockkit.locked_update(Stock.objects.using(alias).filter(sku="a"), change)

    def passing(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        return execute(sql, params, many, context)

    # The scope path on PostgreSQL too (an execute wrapper): it was retried as a lost connection (found by a review).
    with connections[alias].execute_wrapper(passing), pytest.raises(lockkit.QueryInChange, match="closed"):
        lockkit.locked_update(Stock.objects.using(alias).filter(sku="a"), closing)
    assert dict(Stock.objects.using(alias).values_list("sku", "available")) == {"a": 5, "b": 5}
    assert _idle(alias)
    assert lockkit.locked_update(Stock.objects.using(alias).filter(sku="a"), _reserve(1)).available == 4


@pytest.mark.parametrize("alias", VENDORS)
def test_a_constraint_violation_commits_nothing_and_the_next_call_works(alias: str) -> None:
    Stock.objects.using(alias).create(sku="a", available=1)
    attempts: list[int] = []

    def overdraw(row: Stock) -> dict[str, int]:
        attempts.append(row.available)
        return {"available": -1}  # CHECK (available >= 0)

    with pytest.raises(IntegrityError):
        lockkit.locked_update(Stock.objects.using(alias).filter(sku="a"), overdraw)
    assert attempts == [1]
    assert Stock.objects.using(alias).get(sku="a").available == 1
    assert _idle(alias)
    assert lockkit.locked_update(Stock.objects.using(alias).filter(sku="a"), _reserve(1)).available == 0


@pytest.mark.parametrize("alias", VENDORS)
def test_bad_input_is_refused_before_any_sql(alias: str) -> None:
    Stock.objects.using(alias).create(sku="a", available=1)
    qs = Stock.objects.using(alias).filter(sku="a")
    with CaptureQueriesContext(connections[alias]) as queries:
        with pytest.raises(TypeError, match="queryset"):
            lockkit.locked_update(Stock, _reserve(1))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="change"):
            lockkit.locked_update(qs, {"available": 0})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="queryset"):
            lockkit.locked_update(qs[:1], _reserve(1))
        with pytest.raises(ValueError, match="lock_timeout"):
            lockkit.locked_update(qs, _reserve(1), lock_timeout=-1)
        with pytest.raises(TypeError, match="nowait"):
            lockkit.locked_update(qs, _reserve(1), nowait="yes")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="using"):
            lockkit.locked_update(qs, _reserve(1), using="no-such-alias")
    assert len(queries) == 0


class Doubled(models.Model):
    """A row with a column the database computes (``GeneratedField``), which no update may set.

    Declared here, not in lockkit_tests/models.py: Django's check of a ``GeneratedField`` asks every database for
    its version, so ``manage.py check`` run by other tests (against databases that do not exist) would fail. The
    test databases get its table as they get every model of the app (collected before they are created).
    """

    value = models.IntegerField()
    doubled = models.GeneratedField(
        expression=models.F("value") * 2, output_field=models.IntegerField(), db_persist=True
    )
    objects: models.Manager[Doubled] = models.Manager()

    class Meta:
        app_label = "lockkit_tests"


@pytest.mark.parametrize("alias", VENDORS)
def test_a_generated_field_is_refused_before_any_write(alias: str) -> None:
    # Found by a hostile review: Django's update compiler leaves a GeneratedField out without a word, so
    # {"doubled": 5} sent " RETURNING ...; COMMIT" (a syntax error) on PostgreSQL and wrote nothing on MariaDB
    # while reporting success, and {"value": 7, "doubled": 5} dropped "doubled" silently.
    made = Doubled.objects.using(alias).create(value=3)
    qs = Doubled.objects.using(alias).filter(pk=made.pk)
    for chosen in ({"doubled": 5}, {"value": 7, "doubled": 5}):

        def change(row: Doubled, picked: dict[str, int] = chosen) -> dict[str, int]:
            return picked

        with pytest.raises(ValueError, match="GeneratedField"):
            lockkit.locked_update(qs, change)
    assert Doubled.objects.using(alias).values_list("value", "doubled").get() == (3, 6)
    assert _idle(alias)
    assert lockkit.locked_update(qs, lambda row: {"value": 7}).value == 7
    assert Doubled.objects.using(alias).values_list("value", "doubled").get() == (7, 14)


@pytest.mark.parametrize("alias", VENDORS)
def test_a_bad_return_value_rolls_back(alias: str) -> None:
    Stock.objects.using(alias).create(sku="a", available=3)
    qs = Stock.objects.using(alias).filter(sku="a")
    with pytest.raises(TypeError, match="dict"):
        lockkit.locked_update(qs, lambda row: [("available", 1)])  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="not a concrete field"):
        lockkit.locked_update(qs, lambda row: {"colour": 1})
    with pytest.raises(ValueError, match="primary key"):
        lockkit.locked_update(qs, lambda row: {"sku": "b"})
    with pytest.raises(TypeError, match="expression"):
        lockkit.locked_update(qs, lambda row: {"available": F("available") - 1})
    assert Stock.objects.using(alias).get(sku="a").available == 3
    assert _idle(alias)
    # Nothing to write: the row comes back unchanged, nothing is written.
    assert lockkit.locked_update(qs, lambda row: {}).available == 3


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_outside_a_transaction_it_is_two_messages() -> None:
    Stock.objects.create(sku="a", available=5)
    with CaptureQueriesContext(connection) as queries:
        row = lockkit.locked_update(Stock.objects.filter(sku="a"), _reserve(2), lock_timeout=3)
    assert row.available == 3
    sent = [q["sql"] for q in queries.captured_queries]
    assert len(sent) == 2, sent
    assert sent[0].startswith("BEGIN; SELECT set_config('lock_timeout', '3000ms', true)")
    assert "FOR UPDATE OF" in sent[0]
    assert sent[1].startswith("UPDATE")
    assert sent[1].endswith("; COMMIT")
    assert Stock.objects.get(sku="a").available == 3


@pytest.mark.django_db(transaction=True)
def test_inside_atomic_it_joins_the_callers_transaction() -> None:
    Stock.objects.create(sku="a", available=5)
    with pytest.raises(RuntimeError, match="caller"), transaction.atomic():
        assert lockkit.locked_update(Stock.objects.filter(sku="a"), _reserve(2)).available == 3
        assert Stock.objects.get(sku="a").available == 3  # visible inside the caller's transaction
        raise RuntimeError("the caller rolls back")
    assert Stock.objects.get(sku="a").available == 5
    with transaction.atomic():
        lockkit.locked_update(Stock.objects.filter(sku="a"), _reserve(2))
    assert Stock.objects.get(sku="a").available == 3


@pytest.mark.django_db(transaction=True)
def test_a_proxy_model_is_written_through_its_concrete_table() -> None:
    Stock.objects.create(sku="a", available=5)
    row = lockkit.locked_update(StockProxy.objects.filter(sku="a"), _reserve(1))
    assert isinstance(row, StockProxy)
    assert Stock.objects.get(sku="a").available == 4


@pytest.mark.parametrize("alias", vendor_params())
def test_a_lock_timeout_reruns_the_whole_call_on_the_fresh_row(alias: str) -> None:
    Stock.objects.using(alias).create(sku="a", available=5)
    events: list[RetryEvent] = []
    seen: list[int] = []
    policy = RetryPolicy(
        retry_on={Failure.LOCK_TIMEOUT}, attempts=20, before_retry=events.append, wait_max=0.05
    )

    def change(row: Stock) -> dict[str, int]:
        seen.append(row.available)
        return {"available": row.available - 1}

    with hold_lock(Stock.objects.using(alias).filter(sku="a"), using=alias, timeout=20) as held:
        caller = in_thread(
            lambda: lockkit.locked_update(
                Stock.objects.using(alias).filter(sku="a"), change, lock_timeout=1, retry=policy
            )
        )
        wait_until_blocked(held, timeout=JOIN)
        # The holder writes and commits: the retried call must decide on the value it wrote.
        held.run(lambda: Stock.objects.using(alias).filter(sku="a").update(available=F("available") - 2))
        held.release(commit=True)
    row = caller.result(timeout=JOIN)
    assert row.available == 2
    assert seen[-1] == 3  # the last call of change() saw the holder's committed value
    assert Stock.objects.using(alias).get(sku="a").available == 2


@pytest.mark.parametrize("alias", vendor_params())
def test_nowait_fails_at_once_when_the_row_is_held(alias: str) -> None:
    Stock.objects.using(alias).create(sku="a", available=5)
    with hold_lock(Stock.objects.using(alias).filter(sku="a"), using=alias):
        with pytest.raises(lockkit.LockNotAvailable):
            lockkit.locked_update(Stock.objects.using(alias).filter(sku="a"), _reserve(1), nowait=True)
    assert Stock.objects.using(alias).get(sku="a").available == 5
    assert lockkit.locked_update(Stock.objects.using(alias).filter(sku="a"), _reserve(1)).available == 4


@pytest.mark.django_db(transaction=True)
def test_the_awaitable_form() -> None:
    Stock.objects.create(sku="a", available=5)
    row = asyncio.run(lockkit.alocked_update(Stock.objects.filter(sku="a"), _reserve(2)))
    assert row.available == 3
    assert Stock.objects.get(sku="a").available == 3


@pytest.mark.parametrize("alias", VENDORS)
def test_deferred_fields_are_read_whole_on_every_path(alias: str) -> None:
    Stock.objects.using(alias).create(sku="a", available=5)
    written = []
    for queryset in (
        Stock.objects.using(alias).filter(sku="a").only("sku"),
        Stock.objects.using(alias).filter(sku="a").defer("available"),
    ):
        written.append(lockkit.locked_update(queryset, _reserve(1)).available)
        with transaction.atomic(using=alias):  # the scope path too
            written.append(lockkit.locked_update(queryset, _reserve(1)).available)
    assert written == [4, 3, 2, 1]
    assert Stock.objects.using(alias).get(sku="a").available == 1


@pytest.mark.parametrize("alias", VENDORS)
def test_values_querysets_are_refused_before_any_sql(alias: str) -> None:
    Stock.objects.using(alias).create(sku="a", available=5)
    with CaptureQueriesContext(connections[alias]) as queries:
        for queryset in (
            Stock.objects.using(alias).filter(sku="a").values(),
            Stock.objects.using(alias).filter(sku="a").values_list("sku"),
        ):
            with pytest.raises(ValueError, match=r"values\(\)"):
                lockkit.locked_update(queryset, _reserve(1))  # type: ignore[type-var]
            with pytest.raises(ValueError, match=r"values\(\)"):
                lockkit.guarded_update(queryset, available=F("available") - 1)  # type: ignore[type-var]
        # An extra(select=...) column cannot come back (found by a review: dropped without a word).
        extra = Stock.objects.using(alias).filter(sku="a").extra(select={"double": "available * 2"})
        with pytest.raises(ValueError, match=r"extra\(select"):
            lockkit.locked_update(extra, _reserve(1))
        with pytest.raises(ValueError, match=r"extra\(select"):
            lockkit.guarded_update(extra, available=F("available") - 1)
    assert len(queries) == 0
    assert Stock.objects.using(alias).get(sku="a").available == 5


@pytest.mark.parametrize("alias", VENDORS)
@pytest.mark.parametrize("inside", [False, True], ids=["outside", "in-atomic"])
def test_related_loading_is_refused_before_any_sql_on_every_path(alias: str, inside: bool) -> None:
    """``select_related()``/``prefetch_related()`` are refused alike everywhere (a review helper: on PostgreSQL's
    two-message path a related row read in ``change()`` was a query, ``QueryInChange``; in ``atomic()`` it worked)."""
    Item.objects.using(alias).create(name="a", value=1)
    with contextlib.ExitStack() as stack:
        if inside:
            stack.enter_context(transaction.atomic(using=alias))
        with CaptureQueriesContext(connections[alias]) as queries:
            for queryset in (
                Item.objects.using(alias).filter(name="a").select_related("owner"),
                Item.objects.using(alias).filter(name="a").select_related(),
                Item.objects.using(alias).filter(name="a").prefetch_related("owner"),
            ):
                with pytest.raises(ValueError, match=r"select_related\(\)/prefetch_related\(\)"):
                    lockkit.locked_update(queryset, lambda row: {"value": row.value + 1})
        assert len(queries) == 0
    assert Item.objects.using(alias).get(name="a").value == 1


@pytest.mark.parametrize("alias", VENDORS)
def test_two_rows_read_the_same_on_every_path_and_pk_is_the_key(alias: str) -> None:
    Stock.objects.using(alias).bulk_create([Stock(sku="a", available=5), Stock(sku="b", available=5)])
    messages = []
    for inside in (False, True):
        with contextlib.ExitStack() as stack:
            if inside:
                stack.enter_context(transaction.atomic(using=alias))
            with pytest.raises(Stock.MultipleObjectsReturned) as raised:
                lockkit.locked_update(Stock.objects.using(alias).all(), _reserve(1))
            messages.append(str(raised.value))
    assert messages[0] == messages[1]
    assert "locked_update changes exactly one row" in messages[0]
    with pytest.raises(ValueError, match="primary key"):
        lockkit.locked_update(Stock.objects.using(alias).filter(sku="a"), lambda row: {"pk": "c"})


@pytest.mark.parametrize("alias", VENDORS)
@pytest.mark.parametrize("returned", [{"sku": "b"}, {"warehouse": 2}, {"pk": (2, "b")}])
def test_a_part_of_a_composite_primary_key_is_refused_on_every_vendor(
    alias: str, returned: dict[str, Any]
) -> None:
    """``change()`` rewriting one column of a ``CompositePrimaryKey``: refused, nothing written, on every vendor.

    Before, PostgreSQL committed the new key, and MariaDB and SQLite raised ``DoesNotExist`` for a row that exists.
    """
    PairStock.objects.using(alias).create(warehouse=1, sku="a", available=5)
    queryset = PairStock.objects.using(alias).filter(warehouse=1, sku="a")
    with pytest.raises(ValueError, match=r"primary key .*the locked row keeps its key"):
        lockkit.locked_update(queryset, lambda row: {"available": 4, **returned})
    assert list(PairStock.objects.using(alias).values_list("warehouse", "sku", "available")) == [(1, "a", 5)]


@pytest.mark.django_db(transaction=True)
def test_a_call_inside_atomic_is_named_locked_update_in_its_note() -> None:
    Stock.objects.create(sku="a", available=5)
    with hold_lock(Stock.objects.filter(sku="a"), timeout=20):
        with pytest.raises(lockkit.LockTimeout) as raised, transaction.atomic():
            lockkit.locked_update(Stock.objects.filter(sku="a"), _reserve(1), lock_timeout=0.2)
    notes = " ".join(getattr(raised.value, "__notes__", []))
    assert "lockkit.locked_update" in notes
    assert "<locals>" not in notes


@pytest.mark.parametrize("alias", VENDORS)
def test_a_foreign_key_by_attname_or_instance_is_written_and_returned_as_stored(alias: str) -> None:
    from lockkit_tests.models import Item, Owner

    first, second = Owner.objects.using(alias).create(), Owner.objects.using(alias).create()
    item = Item.objects.using(alias).create(name="x", value=1)
    row = lockkit.locked_update(
        Item.objects.using(alias).filter(pk=item.pk), lambda r: {"owner_id": first.pk}
    )
    assert row.owner_id == first.pk
    row = lockkit.locked_update(Item.objects.using(alias).filter(pk=item.pk), lambda r: {"owner": second})
    assert row.owner_id == second.pk
    assert Item.objects.using(alias).get(pk=item.pk).owner_id == second.pk
    with pytest.raises(ValueError, match="twice"):
        lockkit.locked_update(
            Item.objects.using(alias).filter(pk=item.pk), lambda r: {"owner": first, "owner_id": first.pk}
        )
    # The row comes back as the database stored it (an int column given a float).
    row = lockkit.locked_update(Item.objects.using(alias).filter(pk=item.pk), lambda r: {"value": 3.0})
    assert row.value == Item.objects.using(alias).get(pk=item.pk).value == 3
    assert isinstance(row.value, int)


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_work_committed_on_another_alias_is_never_retried_with_the_attempt() -> None:
    Stock.objects.using("default").create(sku="a", available=5)
    Stock.objects.using("other").create(sku="b", available=10)
    attempts: list[int] = []

    @lockkit.locked_operation("default", retry=RetryPolicy(attempts=3, retry_on={Failure.LOCK_TIMEOUT}))
    def both() -> None:
        scope = lockkit.current_scope()
        attempts.append(scope.attempt)
        scope.get(Stock, pk="a")
        lockkit.locked_update(Stock.objects.using("other").filter(sku="b"), _reserve(1))
        raise lockkit.LockTimeout("a retryable failure after the other alias committed", alias="default")

    with pytest.raises(lockkit.LockTimeout) as raised:
        both()
    assert attempts == [1]  # not retried: the work on 'other' is committed
    assert Stock.objects.using("other").get(sku="b").available == 9  # once
    assert any("committed on database 'other'" in note for note in raised.value.__notes__)


@pytest.mark.parametrize("alias", VENDORS)
def test_the_row_written_is_the_row_locked_whatever_change_does_to_its_key(alias: str) -> None:
    """``change()`` sets the instance's primary key without returning it (found by a review: the UPDATE went to
    that key, matched nothing, and a lost reply was reported as the write done)."""
    Stock.objects.using(alias).bulk_create([Stock(sku="a", available=5), Stock(sku="b", available=5)])

    def change(row: Stock) -> dict[str, int]:
        row.sku = "b"
        return {"available": row.available - 1}

    row = lockkit.locked_update(Stock.objects.using(alias).filter(sku="a"), change)
    assert (row.sku, row.available) == ("a", 4)
    assert dict(Stock.objects.using(alias).values_list("sku", "available")) == {"a": 4, "b": 5}


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_an_error_of_another_database_in_change_is_change_s_own() -> None:
    """Only database use on the call's own alias is ``QueryInChange`` (found by a review: any ``ProgrammingError``
    out of ``change()`` was, with the call's alias in its message)."""
    Stock.objects.create(sku="a", available=5)

    def change(row: Stock) -> dict[str, int]:
        with connections["other"].cursor() as cursor:
            cursor.execute("SELECT * FROM lockkit_tests_no_such_table")
        return {"available": 1}

    with pytest.raises(ProgrammingError) as raised:
        lockkit.locked_update(Stock.objects.filter(sku="a"), change)
    assert not isinstance(raised.value, lockkit.QueryInChange)
    assert Stock.objects.get(sku="a").available == 5
