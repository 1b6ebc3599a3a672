"""``save_with_commit()`` from a compiled row ``UPDATE``: what ``save()`` does, without Django's compiler in the hold.

On PostgreSQL (psycopg 3), a model whose ``save()`` is one plain ``UPDATE`` is saved from a statement compiled once
(``lockkit.backends.sql.rowupdate``); these tests hold it to ``save()``'s behaviour (signals, ``auto_now``, deferred
fields, expressions, related objects) and to the truth when something fails after the ``COMMIT`` was sent. Whether
Django's update compiler ran is observed with ``sys.setprofile`` (read-only), not by replacing anything.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from types import CodeType, FrameType
from typing import Any

import pytest
from django.db import DatabaseError, models
from django.db.models import F
from django.db.models.signals import post_save, pre_save
from django.db.models.sql.compiler import SQLCompiler, SQLUpdateCompiler

import lockkit
from lockkit import DeadlockDetected, RetryPolicy
from lockkit.backends.sql import rowupdate
from lockkit.testing import hold_lock
from lockkit_tests.models import AuditedStock, Owner, StampedStock, Stock, StockProxy
from lockkit_tests.support.util import identify_server
from lockkit_tests.support.wire import requests

pg = pytest.mark.django_db(transaction=True)
_AS_SQL = SQLUpdateCompiler.as_sql.__code__
_SELECT_AS_SQL = SQLCompiler.as_sql.__code__


@contextmanager
def calls_of(code: CodeType) -> Iterator[list[int]]:
    """Count the calls of the function whose code is ``code`` in the block (a profiler hook, read-only)."""
    counted = [0]
    previous = sys.getprofile()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            counted[0] += 1

    sys.setprofile(profile)
    try:
        yield counted
    finally:
        sys.setprofile(previous)


def update_compilations() -> AbstractContextManager[list[int]]:
    """Count the calls of Django's ``SQLUpdateCompiler.as_sql`` in the block."""
    return calls_of(_AS_SQL)


@contextmanager
def receivers(*pairs: tuple[Any, Any]) -> Iterator[None]:
    for signal, receiver in pairs:
        signal.connect(receiver, weak=False)
    try:
        yield
    finally:
        for signal, receiver in pairs:
            signal.disconnect(receiver)


def _signal_log(log: list[tuple[Any, ...]]) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    def before(sender: Any, instance: Any, raw: bool, using: str, update_fields: Any, **kw: Any) -> None:
        log.append(("pre_save", sender, instance.pk, raw, using, update_fields))

    def after(
        sender: Any, instance: Any, created: bool, raw: bool, using: str, update_fields: Any, **kw: Any
    ) -> None:
        log.append(("post_save", sender, instance.pk, created, raw, using, update_fields))

    return (pre_save, before), (post_save, after)


@pg
@pytest.mark.parametrize("update_fields", [["available"], None])
def test_a_plain_model_is_saved_without_djangos_compiler_in_three_requests(update_fields: Any) -> None:
    identify_server("default")
    Stock.objects.create(sku="widget", available=5)
    with requests() as sent, lockkit.locked() as scope:
        stock = scope.get(Stock, pk="widget")
        stock.available -= 2
        with update_compilations() as compiled:
            scope.save_with_commit(stock, update_fields=update_fields)
    assert compiled == [0]
    assert sent.count == 3
    assert (
        sent.texts[-1]
        == """UPDATE "lockkit_tests_stock" SET "available" = 3 WHERE "lockkit_tests_stock"."sku" = 'widget'; COMMIT"""
    )
    assert Stock.objects.get(pk="widget").available == 3


@pg
def test_a_proxy_is_saved_in_the_message_from_the_compiled_statement() -> None:
    identify_server("default")
    Stock.objects.create(sku="widget", available=5)
    with requests() as sent, lockkit.locked() as scope:
        stock = scope.get(StockProxy, pk="widget")
        stock.available = 4
        with update_compilations() as compiled:
            scope.save_with_commit(stock, update_fields=["available"])
    assert (compiled, sent.count) == ([0], 3)
    assert sent.texts[-1].endswith("; COMMIT")
    assert Stock.objects.get(pk="widget").available == 4


@pg
@pytest.mark.parametrize("model", [Stock, AuditedStock])
def test_update_fields_given_as_a_generator_is_read_once(model: type[Stock]) -> None:
    Stock.objects.create(sku="widget", available=5)
    with lockkit.locked() as scope:
        stock = scope.get(model, pk="widget")
        stock.available = 2
        scope.save_with_commit(stock, update_fields=(name for name in ["available"]))
    assert Stock.objects.get(pk="widget").available == 2


@pg
def test_an_overridden_save_is_run() -> None:
    Stock.objects.create(sku="widget", available=5)
    before = AuditedStock.saves
    with lockkit.locked() as scope:
        stock = scope.get(AuditedStock, pk="widget")
        stock.available = 4
        with update_compilations() as compiled:
            scope.save_with_commit(stock, update_fields=["available"])
    assert AuditedStock.saves == before + 1
    assert compiled[0] >= 1  # Django's save() compiled it
    assert Stock.objects.get(pk="widget").available == 4


@pg
@pytest.mark.parametrize("model", [Stock, StockProxy])
@pytest.mark.parametrize("update_fields", [["available"], None])
def test_the_signals_are_those_save_sends(model: type[Stock], update_fields: Any) -> None:
    model.objects.create(sku="a", available=5)
    model.objects.create(sku="b", available=5)
    by_save: list[tuple[Any, ...]] = []
    by_message: list[tuple[Any, ...]] = []
    with receivers(*_signal_log(by_save)), lockkit.locked() as scope:
        row = scope.get(model, pk="a")
        row.available = 1
        row.save(update_fields=update_fields)
    with receivers(*_signal_log(by_message)), lockkit.locked() as scope:
        row = scope.get(model, pk="b")
        row.available = 1
        scope.save_with_commit(row, update_fields=update_fields)
    assert [entry[:2] for entry in by_message] == [("pre_save", model), ("post_save", model)]
    assert [(e[0], *e[3:]) for e in by_message] == [(e[0], *e[3:]) for e in by_save]
    assert list(Stock.objects.order_by("sku").values_list("available", flat=True)) == [1, 1]


@pg
@pytest.mark.parametrize("update_fields", [["available", "touched"], None])
def test_auto_now_is_set_as_save_sets_it(update_fields: Any) -> None:
    created = StampedStock.objects.create(sku="widget", available=5)
    with lockkit.locked() as scope:
        stock = scope.get(StampedStock, pk="widget")
        stock.available = 4
        scope.save_with_commit(stock, update_fields=update_fields)
    stored = StampedStock.objects.get(pk="widget")
    assert stored.touched > created.touched
    assert stored.touched == stock.touched
    assert stored.available == 4


@pg
def test_a_deferred_field_is_left_as_save_leaves_it() -> None:
    created = StampedStock.objects.create(sku="widget", available=5)
    with lockkit.locked() as scope:
        stock = scope.get(StampedStock.objects.only("available"), pk="widget")
        stock.available = 4
        scope.save_with_commit(stock)  # save() writes the loaded fields only: touched stays
    stored = StampedStock.objects.get(pk="widget")
    assert (stored.available, stored.touched) == (4, created.touched)


@pg
def test_an_expression_value_is_compiled_by_django() -> None:
    Stock.objects.create(sku="widget", available=5)
    with lockkit.locked() as scope:
        stock = scope.get(Stock, pk="widget")
        stock.available = F("available") - 2
        scope.save_with_commit(stock, update_fields=["available"])
    assert Stock.objects.get(pk="widget").available == 3


@pg
def test_an_expression_a_pre_save_receiver_sets_is_compiled_by_django() -> None:
    Stock.objects.create(sku="widget", available=5)

    def decrement(sender: Any, instance: Any, **kwargs: Any) -> None:
        if sender is Stock:
            instance.available = F("available") - 3

    with receivers((pre_save, decrement)), lockkit.locked() as scope:
        stock = scope.get(Stock, pk="widget")
        scope.save_with_commit(stock, update_fields=["available"])
    assert Stock.objects.get(pk="widget").available == 2


@pg
def test_a_pre_save_receivers_own_update_of_the_table_is_not_the_one_sent_with_the_commit() -> None:
    Stock.objects.create(sku="widget", available=5)
    Stock.objects.create(sku="audit", available=0)

    def audit(sender: Any, instance: Any, **kwargs: Any) -> None:
        if sender is Stock and instance.pk == "widget":
            Stock.objects.filter(pk="audit").update(available=F("available") + 1)

    with receivers((pre_save, audit)), requests() as sent, lockkit.locked() as scope:
        stock = scope.get(Stock, pk="widget")
        stock.available = 4
        scope.save_with_commit(stock, update_fields=["available"])
    assert not sent.texts[-2].endswith("; COMMIT")  # the receiver's UPDATE, on its own
    assert sent.texts[-1].startswith('UPDATE "lockkit_tests_stock" SET "available" = 4 WHERE')
    assert sent.texts[-1].endswith("; COMMIT")
    assert dict(Stock.objects.values_list("sku", "available")) == {"widget": 4, "audit": 1}


@pg
def test_a_cached_related_object_goes_through_save() -> None:
    owner = Owner.objects.create(name="o")
    StampedStock.objects.create(sku="widget", available=5)
    with lockkit.locked() as scope:
        stock = scope.get(StampedStock, pk="widget")
        stock.owner = owner
        with update_compilations() as compiled:
            scope.save_with_commit(stock, update_fields=["owner"])
    assert compiled[0] >= 1
    assert StampedStock.objects.get(pk="widget").owner_id == owner.pk


@pg
def test_an_unsaved_related_object_is_refused_as_save_refuses_it_before_any_sql() -> None:
    StampedStock.objects.create(sku="widget", available=5)
    with lockkit.locked() as scope:
        stock = scope.get(StampedStock, pk="widget")
        stock.owner = Owner(name="unsaved")
        with requests() as sent, pytest.raises(ValueError, match="unsaved related object"):
            scope.save_with_commit(stock, update_fields=["owner"])
        assert sent.count == 0
        stock.owner = None
        scope.save_with_commit(
            stock, update_fields=["owner", "available"]
        )  # refused before SQL: may save again
    assert StampedStock.objects.get(pk="widget").owner_id is None


@pg
@pytest.mark.parametrize("model", [Stock, AuditedStock])
def test_a_receiver_raising_after_the_commit_is_not_retried_and_says_it_committed(model: type[Stock]) -> None:
    Stock.objects.create(sku="widget", available=5)
    ran: list[str] = []
    attempts: list[int] = []

    def fail(sender: Any, **kwargs: Any) -> None:
        if sender is model:
            raise DeadlockDetected(
                "a post_save receiver failed", alias="default"
            )  # retryable, were it before

    @lockkit.locked_operation(retry=RetryPolicy(attempts=3))
    def reserve() -> None:
        attempts.append(1)
        scope = lockkit.current_scope()
        stock = scope.get(model, pk="widget")
        stock.available -= 1
        scope.on_commit(lambda: ran.append("callback"))
        scope.save_with_commit(stock, update_fields=["available"])

    with receivers((post_save, fail)), pytest.raises(DeadlockDetected, match="receiver failed") as caught:
        reserve()
    assert attempts == [1]  # committed: never retried
    assert Stock.objects.get(pk="widget").available == 4
    assert ran == ["callback"]
    assert any("already committed" in note for note in getattr(caught.value, "__notes__", []))
    with lockkit.locked() as scope:  # the next scope on the connection works
        stock = scope.get(Stock, pk="widget")
        stock.available = 3
        scope.save_with_commit(stock)
    assert Stock.objects.get(pk="widget").available == 3


@pg
def test_a_row_the_scope_deleted_is_reported_and_the_commit_is_told() -> None:
    Stock.objects.create(sku="widget", available=5)
    Stock.objects.create(sku="other", available=5)
    with pytest.raises(DatabaseError, match="did not affect any rows") as caught, lockkit.locked() as scope:
        stock = scope.get(Stock, pk="widget")
        scope.get(Stock, pk="other").delete()
        Stock.objects.filter(pk="widget").delete()
        scope.save_with_commit(stock, update_fields=["available"])
    assert any("already committed" in note for note in getattr(caught.value, "__notes__", []))
    assert not Stock.objects.exists()  # the scope's deletes committed with the empty UPDATE


def test_plans_are_refused_for_what_save_does_otherwise() -> None:
    assert rowupdate.plan_for(Stock, "default", ["available"]) is not None
    assert rowupdate.plan_for(Stock, "default", ["available"]) is rowupdate.plan_for(
        Stock, "default", ("available",)
    )
    assert rowupdate.plan_for(Stock, "default", []) is None  # save() does nothing
    assert rowupdate.plan_for(Stock, "default", ["nope"]) is None  # save() raises its ValueError
    assert rowupdate.plan_for(Stock, "default", ["sku"]) is None  # the primary key
    assert rowupdate.plan_for(Stock, "default", "available") is None  # a string: save() refuses it
    assert rowupdate.plan_for(AuditedStock, "default", None) is None  # save() overridden
    plan = rowupdate.plan_for(StampedStock, "default", ["owner"])
    assert plan is not None
    assert [f.name for f in plan.fields] == ["owner"]
    assert isinstance(plan.fields[0], models.ForeignKey)


# -- scope.get(Model, pk=...) from the locking SELECT compiled the first time ------------------------------------


def select_compilations() -> AbstractContextManager[list[int]]:
    """Count the calls of Django's ``SQLCompiler.as_sql`` (selects) in the block."""
    return calls_of(_SELECT_AS_SQL)


@pg
@pytest.mark.parametrize("model", [Stock, StockProxy])
def test_get_by_pk_is_djangos_row_and_compiled_once(model: type[Stock]) -> None:
    Stock.objects.create(sku="a", available=5)
    Stock.objects.create(sku="b", available=7)
    with lockkit.locked() as scope:
        first = scope.get(model, pk="a")
    with requests() as sent, lockkit.locked() as scope, select_compilations() as compiled:
        second = scope.get(model, sku="b")
        expected = model.objects.get(pk="b")
    assert compiled == [1]  # the comparison's own get(); the scope's SELECT was not compiled again
    assert type(second) is model
    assert type(first) is model
    assert (first.pk, first.available, second.pk, second.available) == ("a", 5, "b", 7)
    assert second.__dict__.keys() == expected.__dict__.keys()
    assert (second._state.db, second._state.adding) == ("default", False)
    assert "FOR UPDATE" in sent.texts[1]
    assert "'b'" in sent.texts[1]


@pg
@pytest.mark.parametrize("options", [{"lock_timeout": 0.1}, {"nowait": True}])
def test_get_by_pk_waits_for_the_row_lock_as_the_scope_says(options: dict[str, Any]) -> None:
    Stock.objects.create(sku="a", available=5)
    with lockkit.locked(**options) as scope:
        scope.get(Stock, pk="a")  # compiled here
    expected = lockkit.LockTimeout if "lock_timeout" in options else lockkit.LockNotAvailable
    with hold_lock(Stock.objects.filter(pk="a")), pytest.raises(expected), lockkit.locked(**options) as scope:
        scope.get(Stock, pk="a")
    with lockkit.locked(**options) as scope:  # the next scope works
        assert scope.get(Stock, pk="a").available == 5


@pg
def test_get_by_pk_raises_as_queryset_get() -> None:
    owner = Owner.objects.create(name="o")
    with lockkit.locked() as scope:
        assert scope.get(Owner, pk=owner.pk).name == "o"
        with pytest.raises(Owner.DoesNotExist, match="Owner matching query does not exist"):
            scope.get(Owner, pk=owner.pk + 1)
    with lockkit.locked() as scope, requests() as sent:
        with pytest.raises(ValueError, match="expected a number"):
            scope.get(Owner, pk="x")
        assert sent.count == 0
        assert scope.get(Owner, id=owner.pk).pk == owner.pk
