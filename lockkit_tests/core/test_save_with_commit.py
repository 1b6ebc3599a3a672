"""``LockScope.save_with_commit``: the row's UPDATE travels with the scope's COMMIT, and is its last statement.

PostgreSQL (psycopg 3): one simple-query message ``UPDATE ...; COMMIT``, three requests per reservation in all
(counted from libpq's own trace), and nothing at the scope's end. Nested in ``atomic()``, on MariaDB and on SQLite
it is a plain ``save()``; the last-statement rule and the locked-row rule hold everywhere.
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.models.signals import post_save, pre_save

import lockkit
from lockkit import RetryPolicy, RowNotLocked, StatementAfterCommit
from lockkit.scopes import unlocked
from lockkit.testing import hold_lock, in_thread, wait_until_blocked
from lockkit_tests.models import Item, Owner, PeerCountry, Stock
from lockkit_tests.support.util import identify_server
from lockkit_tests.support.vendors import vendor_params
from lockkit_tests.support.wire import requests

pg = pytest.mark.django_db(transaction=True)

VENDORS = [
    *vendor_params(),
    pytest.param(
        "sqlite",
        id="sqlite",
        marks=[pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])],
    ),
]


def _reserve(alias: str = "default", *, quantity: int = 1, **options: Any) -> int:
    with lockkit.locked(alias, **options) as scope:
        stock = scope.get(Stock, pk="widget")
        stock.available -= quantity
        scope.save_with_commit(stock, update_fields=["available"])
    return stock.available


def _idle() -> None:
    raw: Any = connection.connection
    assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert raw.autocommit
    assert not connection.in_atomic_block
    assert connection.execute_wrappers == []


@pg
def test_a_reservation_is_three_requests_the_update_carrying_the_commit() -> None:
    identify_server("default")
    Stock.objects.create(sku="widget", available=5)
    ran: list[int] = []
    with requests() as sent:
        with lockkit.locked() as scope:
            stock = scope.get(Stock, pk="widget")
            stock.available -= 2
            scope.on_commit(lambda: ran.append(Stock.objects.get(pk="widget").available))
            scope.save_with_commit(stock, update_fields=["available"])
    assert sent.count == 4  # the three of the reservation, and the on_commit callback's own SELECT
    opening, locking, update, callback = sent.texts
    assert opening.startswith("BEGIN; SELECT set_config('lock_timeout', '5000ms', true)")
    assert "FOR UPDATE" in locking
    assert update.startswith('UPDATE "lockkit_tests_stock" SET "available" = 3 WHERE')
    assert update.endswith("; COMMIT")
    assert callback.startswith("SELECT")  # after the commit: the callback saw the committed value
    assert ran == [3]
    assert Stock.objects.get(pk="widget").available == 3
    _idle()


@pg
def test_a_plain_save_reservation_is_four_requests() -> None:
    identify_server("default")
    Stock.objects.create(sku="widget", available=5)
    with requests() as sent, lockkit.locked() as scope:
        stock = scope.get(Stock, pk="widget")
        stock.available -= 1
        stock.save(update_fields=["available"])
    assert sent.count == 4
    assert sent.texts[-1] == "COMMIT"


@pg
def test_the_scope_sends_nothing_after_the_message() -> None:
    identify_server("default")
    Stock.objects.create(sku="widget", available=5)
    with contextlib.ExitStack() as tracing:
        with lockkit.locked(lock_timeout=2, statement_timeout=3) as scope:
            stock = scope.get(Stock, pk="widget")
            stock.available -= 1
            sent = tracing.enter_context(requests())
            scope.save_with_commit(stock)
        # The trace is still on: the scope's exit path (commit, autocommit, restoring nothing) was traced too.
    assert sent.count == 1
    assert sent.texts[0].endswith("; COMMIT")
    assert Stock.objects.get(pk="widget").available == 4
    _idle()


@pytest.mark.parametrize("alias", VENDORS)
def test_the_saved_row_is_committed_on_every_vendor(alias: str) -> None:
    Stock.objects.using(alias).create(sku="widget", available=5)
    assert _reserve(alias, quantity=2) == 3
    assert Stock.objects.using(alias).get(pk="widget").available == 3
    assert _reserve(alias) == 2  # and the next scope on the connection works
    assert connections[alias].execute_wrappers == []


@pytest.mark.parametrize("alias", VENDORS)
@pytest.mark.parametrize("after", ["orm", "cursor"])
def test_a_statement_after_it_raises_before_it_is_sent(alias: str, after: str) -> None:
    Stock.objects.using(alias).create(sku="widget", available=5)
    with pytest.raises(StatementAfterCommit, match=r"refused on .* after save_with_commit") as caught:
        with lockkit.locked(alias) as scope:
            stock = scope.get(Stock, pk="widget")
            stock.available = 4
            scope.save_with_commit(stock)
            if after == "orm":
                Stock.objects.using(alias).create(sku="late", available=1)
            else:
                with connections[alias].cursor() as cursor:
                    cursor.execute("DELETE FROM lockkit_tests_stock")
    assert caught.value.alias == alias
    # Nothing after it reached the database; the save itself is committed (PostgreSQL) or rolled back with the
    # scope's error (the plain save's transaction ends with the error everywhere else).
    assert not Stock.objects.using(alias).filter(pk="late").exists()
    expected = 4 if alias == "default" else 5
    assert Stock.objects.using(alias).get(pk="widget").available == expected
    assert _reserve(alias) == expected - 1
    assert connections[alias].execute_wrappers == []


@pg
def test_the_error_after_a_commit_in_the_message_says_it_committed() -> None:
    Stock.objects.create(sku="widget", available=5)
    ran: list[str] = []
    with pytest.raises(StatementAfterCommit) as caught, lockkit.locked() as scope:
        stock = scope.get(Stock, pk="widget")
        stock.available = 1
        scope.on_commit(lambda: ran.append("callback"))
        scope.save_with_commit(stock)
        Stock.objects.count()
    assert "has already committed" in str(caught.value)
    notes = getattr(caught.value, "__notes__", ())
    assert any("had already committed" in note and "callbacks ran" in note for note in notes)
    assert ran == ["callback"]  # the work is committed: its on_commit callbacks run, as after any commit
    assert Stock.objects.get(pk="widget").available == 1


@pg
def test_a_second_save_with_commit_is_refused() -> None:
    Stock.objects.create(sku="widget", available=5)
    with pytest.raises(StatementAfterCommit, match="already called"), lockkit.locked() as scope:
        stock = scope.get(Stock, pk="widget")
        stock.available = 3
        scope.save_with_commit(stock)
        stock.available = 2
        scope.save_with_commit(stock)
    assert Stock.objects.get(pk="widget").available == 3


@pytest.mark.parametrize("alias", VENDORS)
def test_a_row_the_scope_did_not_lock_is_refused_before_any_sql(alias: str) -> None:
    Stock.objects.using(alias).bulk_create(
        [Stock(sku="widget", available=5), Stock(sku="gadget", available=5)]
    )
    gadget = Stock.objects.using(alias).get(pk="gadget")  # read without a lock
    with lockkit.locked(alias) as scope:
        scope.get(Stock, pk="widget")
        gadget.available = 0
        with pytest.raises(RowNotLocked, match="pk='gadget' was not locked"):
            scope.save_with_commit(gadget)
        with pytest.raises(TypeError, match="must be a saved model instance"):
            scope.save_with_commit("widget")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="has not been saved"):
            scope.save_with_commit(Stock(sku="new", available=1))
        # Refusals leave the scope able to save the row it did lock, and to run statements before it.
        (widget,) = scope.lock_all(Stock, pks=["widget"])
        widget.available = 1
        scope.save_with_commit(widget)
    assert Stock.objects.using(alias).get(pk="gadget").available == 5
    assert Stock.objects.using(alias).get(pk="widget").available == 1


@pytest.mark.parametrize("alias", VENDORS)
@pytest.mark.parametrize("check", [True, False], ids=["unlocked-save check on", "check off"])
def test_a_row_read_from_a_lazy_locking_queryset_is_saved(alias: str, check: bool) -> None:
    Stock.objects.using(alias).bulk_create(
        [Stock(sku="widget", available=5), Stock(sku="gadget", available=5)]
    )
    previous = unlocked.force(check)
    try:
        with lockkit.locked(alias) as scope:
            widget = scope.lock(Stock).get(pk="widget")  # the documented lazy form
            widget.available = 4
            scope.save_with_commit(widget, update_fields=["available"])
        with lockkit.locked(alias) as scope:
            next(iter(scope.lock(Stock.objects.filter(pk="widget"))))
            gadget = Stock.objects.using(alias).get(pk="gadget")  # read without a lock
            gadget.available = 0
            if check and alias != "sqlite":
                # The check (DEBUG, lockkit's pytest plugin) records each row a locking read returned. (SQLite
                # has no FOR UPDATE: its scope holds the database's write lock, so every row is locked.)
                with pytest.raises(RowNotLocked, match="pk='gadget' was not locked"):
                    scope.save_with_commit(gadget)
            else:
                # Without it only the model is recorded for a lazy queryset: the row is not told apart. On SQLite
                # the scope's write lock covers every row.
                scope.save_with_commit(gadget)
    finally:
        unlocked.force(previous)
    assert Stock.objects.using(alias).get(pk="widget").available == 4
    refused = check and alias != "sqlite"
    assert Stock.objects.using(alias).get(pk="gadget").available == (5 if refused else 0)


@pg
def test_a_refusal_sends_nothing() -> None:
    Stock.objects.create(sku="widget", available=5)
    other = Stock.objects.create(sku="other", available=5)
    with lockkit.locked() as scope:
        scope.get(Stock, pk="widget")
        with requests() as sent, pytest.raises(RowNotLocked):
            scope.save_with_commit(other)
    assert sent.count == 0


@pg
def test_a_row_locked_by_the_enclosing_scope_is_saved_plainly_in_a_nested_scope() -> None:
    Stock.objects.create(sku="widget", available=5)
    with lockkit.locked() as outer:
        stock = outer.get(Stock, pk="widget")
        with requests() as sent, lockkit.locked() as inner:
            stock.available = 2
            inner.save_with_commit(stock)
        assert not sent.texts[0].endswith("COMMIT")  # a plain UPDATE: the outer scope owns the transaction
        Stock.objects.count()  # the nested scope has ended: the enclosing one goes on
        transaction.set_rollback(True)
    assert Stock.objects.get(pk="widget").available == 5  # it was part of the outer transaction, rolled back


@pg
def test_inside_atomic_it_is_a_plain_save_committed_by_the_outer_block() -> None:
    Stock.objects.create(sku="widget", available=5)
    with transaction.atomic():
        with requests() as sent, lockkit.locked() as scope:
            stock = scope.get(Stock, pk="widget")
            stock.available = 1
            scope.save_with_commit(stock)
            with pytest.raises(StatementAfterCommit, match="the scope commits when it ends"):
                Stock.objects.count()
        assert not any(text.endswith("COMMIT") for text in sent.texts)
        assert Stock.objects.get(pk="widget").available == 1
    assert Stock.objects.get(pk="widget").available == 1


@pg
def test_update_fields_and_signals_are_those_of_save() -> None:
    Stock.objects.create(sku="widget", available=5)
    seen: list[tuple[str, Any]] = []

    def before(sender: Any, instance: Any, update_fields: Any, **kwargs: Any) -> None:
        seen.append(("pre_save", update_fields))

    def after(sender: Any, instance: Any, created: bool, update_fields: Any, **kwargs: Any) -> None:
        seen.append(("post_save", (created, update_fields)))

    pre_save.connect(before, sender=Stock)
    post_save.connect(after, sender=Stock)
    try:
        with lockkit.locked() as scope:
            stock = scope.get(Stock, pk="widget")
            stock.available = 2
            with pytest.raises(ValueError, match="do not exist in this model"):
                scope.save_with_commit(stock, update_fields=["nope"])  # Django's check: nothing happened
            scope.save_with_commit(stock, update_fields=["available"])
    finally:
        pre_save.disconnect(before, sender=Stock)
        post_save.disconnect(after, sender=Stock)
    assert seen == [("pre_save", frozenset({"available"})), ("post_save", (False, frozenset({"available"})))]
    assert Stock.objects.get(pk="widget").available == 2


@pg
def test_update_fields_leaves_the_other_columns_alone() -> None:
    owner = Owner.objects.create(name="o")
    item = Item.objects.create(name="before", value=1, owner=owner)
    with lockkit.locked() as scope:
        row = scope.get(Item, pk=item.pk)
        row.name, row.value = "after", 2
        scope.save_with_commit(row, update_fields=["value"])
    assert Item.objects.values_list("name", "value").get() == ("before", 2)


@pg
def test_a_multi_table_child_is_saved_plainly() -> None:
    country = PeerCountry.objects.create(code="fr", **_country_fields())
    with requests() as sent, lockkit.locked() as scope:
        row = scope.get(PeerCountry, pk=country.pk)
        row.code = "de"
        scope.save_with_commit(row)
    assert sent.texts[-1] == "COMMIT"  # its UPDATEs (one per table) are plain; the scope commits at its end
    assert PeerCountry.objects.get().code == "de"


def _country_fields() -> dict[str, Any]:
    names = {f.name for f in PeerCountry._meta.concrete_fields} - {"id", "peerentity_ptr", "code"}
    return {name: "x" for name in names}


@pg
def test_a_constraint_violation_is_the_database_error_and_commits_nothing() -> None:
    Stock.objects.create(sku="widget", available=1)
    ran: list[str] = []
    with pytest.raises(IntegrityError), lockkit.locked() as scope:
        stock = scope.get(Stock, pk="widget")
        stock.available = -1
        scope.on_commit(lambda: ran.append("callback"))
        with contextlib.suppress(
            IntegrityError
        ):  # swallowed: the scope still ends with it, having rolled back
            scope.save_with_commit(stock)
    assert ran == []
    assert Stock.objects.get(pk="widget").available == 1
    assert _reserve() == 0
    _idle()


@pg
def test_the_scope_lock_timeout_applies_to_the_update() -> None:
    Stock.objects.create(sku="widget", available=5)
    mine, theirs = Owner.objects.create(name="mine"), Owner.objects.create(name="theirs")
    item = Item.objects.create(name="i", owner=mine)
    # Changing the foreign key takes a KEY SHARE lock on the referenced row: the holder's FOR UPDATE blocks it.
    with hold_lock(theirs), pytest.raises(lockkit.LockTimeout), lockkit.locked(lock_timeout=0.1) as scope:
        row = scope.get(Item, pk=item.pk)
        row.owner = theirs
        scope.save_with_commit(row)
    assert Item.objects.get().owner_id == mine.pk
    assert _reserve() == 4


@pg
def test_a_locked_operation_retries_a_lock_timeout_of_the_update() -> None:
    mine, theirs = Owner.objects.create(name="mine"), Owner.objects.create(name="theirs")
    item = Item.objects.create(name="i", owner=mine)
    attempts: list[int] = []
    with hold_lock(theirs) as holder:

        @lockkit.locked_operation(
            lock_timeout=0.1, retry=RetryPolicy(before_retry=lambda event: holder.release())
        )
        def move() -> None:
            scope = lockkit.current_scope()
            attempts.append(scope.attempt)
            row = scope.get(Item, pk=item.pk)
            row.owner = theirs
            scope.save_with_commit(row)

        move()
    assert attempts == [1, 2]
    assert Item.objects.get().owner_id == theirs.pk


@pg
def test_a_hot_row_under_real_contention_loses_no_update() -> None:
    Stock.objects.create(sku="widget", available=100)
    with hold_lock(Stock.objects.filter(pk="widget")) as holder:
        contenders = [in_thread(_reserve, lock_timeout=10) for _ in range(3)]
        wait_until_blocked(holder, count=3, contenders=contenders)
        holder.run(lambda: Stock.objects.filter(pk="widget").update(available=50))
        holder.release(commit=True)
        results = sorted(call.result(timeout=20) for call in contenders)
    assert results == [47, 48, 49]  # each decided on the value the one before committed
    assert Stock.objects.get(pk="widget").available == 47

    @lockkit.locked_operation(lock_timeout=10)
    def reserve_many() -> None:
        scope = lockkit.current_scope()
        stock = scope.get(Stock, pk="widget")
        stock.available -= 1
        scope.save_with_commit(stock, update_fields=["available"])

    def loop(n: int) -> int:
        for _ in range(n):
            reserve_many()
        return n

    workers = [in_thread(loop, 20) for _ in range(2)]
    assert [call.result(timeout=60) for call in workers] == [20, 20]
    assert Stock.objects.get(pk="widget").available == 7


@pg
def test_server_side_binding_is_a_plain_save() -> None:
    # psycopg's server-binding cursor may prepare a statement it has seen often; a prepared one holds one statement.
    Stock.objects.create(sku="widget", available=50)
    connection.ensure_connection()
    raw: Any = connection.connection
    raw.cursor_factory = psycopg.Cursor  # what Django's server_side_binding option configures
    try:
        for expected in range(49, 41, -1):  # past psycopg's prepare_threshold (5) for the same statement
            with requests() as sent:
                assert _reserve() == expected
            assert sent.texts[-1] == "COMMIT"
            assert not any(text.endswith("; COMMIT") for text in sent.texts)
    finally:
        connection.close()
    assert Stock.objects.get(pk="widget").available == 42
