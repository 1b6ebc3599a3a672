"""``UnlockedSaveWarning``: a locked scope that saves a row it did not lock says so, in DEBUG and under the plugin.

Issue 26, item 5: inside ``@locked_operation``, ``Stock.objects.get(pk=...)`` then ``.save()`` was an unlocked
read-modify-write with no warning.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections, transaction
from django.test.utils import override_settings

import lockkit
from lockkit import UnlockedSaveWarning
from lockkit._engine.callbacks import Callbacks
from lockkit._engine.failures import FailedStatements
from lockkit.claims import claim, fenced
from lockkit.scopes import unlocked
from lockkit_tests.models import Item, Job, Owner, PairStock, PeerEUCountry, Stock
from lockkit_tests.support.vendors import vendor_params

VENDORS = pytest.mark.parametrize("alias", vendor_params())


@pytest.fixture(autouse=True)
def _checking() -> Iterator[None]:
    """The check as the plugin leaves it on for the suite (forced on, whatever DEBUG says)."""
    previous = unlocked.force(True)
    try:
        yield
    finally:
        unlocked.force(previous)


@contextmanager
def no_warning() -> Iterator[None]:
    """Fail if an ``UnlockedSaveWarning`` is emitted in the block (it becomes an error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnlockedSaveWarning)
        yield


def _stock(alias: str, *skus: str) -> None:
    Stock.objects.using(alias).bulk_create([Stock(sku=sku, available=5) for sku in skus])


def _watchers(alias: str) -> list[object]:
    """The connection's execute wrappers but those an outermost scope keeps for its own record (failed statements
    on MariaDB/SQLite, ``lockkit._engine.failures``; the savepoints its callbacks follow, ``lockkit._engine.
    callbacks``), which have nothing to do with unlocked saves."""
    return [
        w
        for w in connections[alias].execute_wrappers
        if not isinstance(w, FailedStatements) and not isinstance(getattr(w, "__self__", None), Callbacks)
    ]


def _message(sku: str, alias: str) -> str:
    return (
        rf"^lockkit_tests\.Stock pk='{sku}' saved in a locked scope on '{alias}' that did not lock this row"
    )


# -- it warns --------------------------------------------------------------------------------------------------------


@VENDORS
def test_an_unlocked_read_then_save_in_a_locked_operation_warns(alias: str) -> None:
    _stock(alias, "a", "b")

    @lockkit.locked_operation(using=alias)
    def reserve() -> None:
        scope = lockkit.current_scope()
        scope.get(Stock, pk="a")  # the scope locks Stock rows...
        stock = Stock.objects.using(alias).get(pk="b")  # ...but reads this one without FOR UPDATE
        stock.available -= 1
        with pytest.warns(UnlockedSaveWarning, match=_message("b", alias)) as caught:
            stock.save()
        (warning,) = caught.list
        assert warning.filename == __file__  # it points at the save() call, not into Django
        assert "scope.get(Model, pk=...)" in str(warning.message)

    reserve()
    assert (
        Stock.objects.using(alias).get(pk="b").available == 4
    )  # a warning, not an error: the save went through


@VENDORS
def test_a_save_with_update_fields_of_an_unlocked_row_warns(alias: str) -> None:
    _stock(alias, "a", "b")
    with lockkit.locked(alias) as scope:
        list(scope.lock(Stock.objects.filter(sku="a")))
        stock = Stock.objects.using(alias).get(pk="b")
        with pytest.warns(UnlockedSaveWarning, match=_message("b", alias)):
            stock.save(update_fields=["available"])


@VENDORS
def test_a_row_read_again_without_the_lock_warns_only_when_it_was_never_locked(alias: str) -> None:
    _stock(alias, "a", "b")
    with lockkit.locked(alias) as scope:
        scope.lock_all(Stock, pks=["a"])
        again = Stock.objects.using(alias).get(pk="a")  # the same row, locked earlier: the lock is held
        with no_warning():
            again.save()
        other = Stock.objects.using(alias).get(pk="b")
        with pytest.warns(UnlockedSaveWarning, match=_message("b", alias)):
            other.save()


# -- it does not warn ------------------------------------------------------------------------------------------------


@VENDORS
def test_rows_locked_by_every_lockkit_path_do_not_warn(alias: str) -> None:
    _stock(alias, "a", "b", "c", "d", "e", "f", "g")
    with lockkit.locked(alias) as scope, no_warning():
        scope.get(Stock, pk="a").save()
        for row in scope.lock(Stock.objects.filter(sku__in=["b", "c"])):
            row.available -= 1
            row.save()
        for row in scope.lock_all(Stock, pks=["d"]):
            row.save()
        lockkit.lock(Stock.objects.filter(sku="e")).get().save()
        # Rows streamed by iterator() while the loop saves: each is built after the locking statement.
        for row in scope.lock(Stock.objects.filter(sku__in=["f", "g"])).iterator(chunk_size=1):
            row.save()
        scope.get(Stock.objects.using(alias).get(pk="a")).save()  # an instance, read again under the lock
    assert sorted(Stock.objects.using(alias).values_list("available", flat=True)) == [4, 4, 5, 5, 5, 5, 5]


@VENDORS
def test_a_plain_select_for_update_in_the_scope_counts_as_locked(alias: str) -> None:
    _stock(alias, "a", "b")
    with lockkit.locked(alias) as scope, no_warning():
        scope.get(Stock, pk="a")
        Stock.objects.using(alias).select_for_update().get(pk="b").save()


@VENDORS
def test_new_rows_do_not_warn(alias: str) -> None:
    _stock(alias, "a")
    with lockkit.locked(alias) as scope, no_warning():
        scope.get(Stock, pk="a")
        Stock.objects.using(alias).create(sku="n1", available=1)
        Stock(sku="n2", available=1).save(using=alias)
        Stock(sku="n3", available=1).save(using=alias, force_insert=True)
        created = Stock.objects.using(alias).get(
            pk="n1"
        )  # read back without a lock: not the scope's doing...
        created.available = 2
    # ...but created in the scope, then saved again: an existing row now, and not locked: that one warns.
    with lockkit.locked(alias) as scope:
        scope.get(Stock, pk="a")
        with pytest.warns(UnlockedSaveWarning, match=_message("n1", alias)):
            created.save()


@VENDORS
def test_a_model_the_scope_locked_no_rows_of_does_not_warn(alias: str) -> None:
    _stock(alias, "a")
    item = Item.objects.using(alias).create(name="x")
    with lockkit.locked(alias) as scope, no_warning():
        scope.get(Stock, pk="a")
        loaded = Item.objects.using(alias).get(pk=item.pk)
        loaded.value = 3
        loaded.save()
        copy = Item.objects.using(alias).get(pk=item.pk)
        copy.pk = None  # a copy: an INSERT
        copy.save()


@VENDORS
def test_related_rows_and_parent_tables_count_as_locked(alias: str) -> None:
    owner = Owner.objects.using(alias).create(name="o")
    item = Item.objects.using(alias).create(name="x", owner=owner)
    country = PeerEUCountry.objects.using(alias).create(name="c", code="CC", joined=1)
    with lockkit.locked(alias) as scope, no_warning():
        locked_item = scope.get(Item.objects.select_related("owner"), pk=item.pk)
        locked_item.save()
        assert locked_item.owner is not None
        scope.get(PeerEUCountry, pk=country.pk).save()  # three tables, all in FOR UPDATE OF


@VENDORS
def test_a_composite_primary_key_is_named_as_its_tuple(alias: str) -> None:
    PairStock.objects.using(alias).bulk_create(
        [PairStock(warehouse=1, sku="a"), PairStock(warehouse=1, sku="b")]
    )
    with lockkit.locked(alias) as scope:
        with no_warning():
            scope.get(PairStock, pk=(1, "a")).save()
        with pytest.warns(UnlockedSaveWarning, match=r"^lockkit_tests\.PairStock pk=\(1, 'b'\) saved"):
            PairStock.objects.using(alias).get(pk=(1, "b")).save()


@VENDORS
def test_saves_outside_any_scope_and_after_it_ended_do_not_warn(alias: str) -> None:
    _stock(alias, "a", "b")
    with lockkit.locked(alias) as scope:
        scope.get(Stock, pk="a")
    with no_warning():
        Stock.objects.using(alias).get(pk="b").save()
        with transaction.atomic(using=alias):
            Stock.objects.using(alias).get(pk="b").save()


@VENDORS
def test_outside_debug_and_without_the_plugin_nothing_is_checked_or_installed(alias: str) -> None:
    _stock(alias, "a", "b")
    unlocked.force(None)  # as without lockkit's pytest plugin: DEBUG decides
    with override_settings(DEBUG=False), lockkit.locked(alias) as scope, no_warning():
        assert _watchers(alias) == []  # nothing installed, nothing recorded
        scope.get(Stock, pk="a")
        Stock.objects.using(alias).get(pk="b").save()
    with override_settings(DEBUG=True), lockkit.locked(alias) as scope:
        assert len(_watchers(alias)) == 1
        scope.get(Stock, pk="a")
        with pytest.warns(UnlockedSaveWarning, match=_message("b", alias)):
            Stock.objects.using(alias).get(pk="b").save()
    unlocked.force(False)  # the plugin's ini option off: DEBUG does not turn it back on
    with override_settings(DEBUG=True), lockkit.locked(alias) as scope, no_warning():
        assert _watchers(alias) == []
        scope.get(Stock, pk="a")
        Stock.objects.using(alias).get(pk="b").save()
    assert connections[alias].execute_wrappers == []


# -- nested scopes, filters ------------------------------------------------------------------------------------------


@VENDORS
def test_nested_scopes_share_the_transactions_locks(alias: str) -> None:
    _stock(alias, "a", "b", "c")
    with lockkit.locked(alias) as outer:
        outer.get(Stock, pk="a")
        with lockkit.locked(alias) as inner:
            assert inner.nested
            assert len(_watchers(alias)) == 1  # the outer scope's, shared
            with no_warning():
                Stock.objects.using(alias).get(pk="a").save()  # locked by the enclosing scope
            inner.get(Stock, pk="c")
            with pytest.warns(UnlockedSaveWarning, match=_message("b", alias)):
                Stock.objects.using(alias).get(pk="b").save()
        with no_warning():
            Stock.objects.using(alias).get(pk="c").save()  # locked by the nested scope: held until commit
        with pytest.warns(UnlockedSaveWarning, match=_message("b", alias)):
            Stock.objects.using(alias).get(pk="b").save()
    assert connections[alias].execute_wrappers == []


@VENDORS
def test_the_filter_turns_the_warning_into_an_error_and_nothing_is_written(alias: str) -> None:
    _stock(alias, "a", "b")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=lockkit.UnlockedSaveWarning)
        with pytest.raises(UnlockedSaveWarning, match=_message("b", alias)), lockkit.locked(alias) as scope:
            scope.get(Stock, pk="a")
            stock = Stock.objects.using(alias).get(pk="b")
            stock.available = 0
            stock.save()
    assert Stock.objects.using(alias).get(pk="b").available == 5


@VENDORS
@pytest.mark.filterwarnings("error::lockkit.UnlockedSaveWarning")
def test_pytest_filterwarnings_names_the_category(alias: str) -> None:
    _stock(alias, "a", "b")
    with pytest.raises(UnlockedSaveWarning), lockkit.locked(alias) as scope:
        scope.get(Stock, pk="a")
        Stock.objects.using(alias).get(pk="b").save()


@VENDORS
def test_fenced_counts_the_job_row_as_locked(alias: str) -> None:
    job, other = (Job.objects.using(alias).create(name=name) for name in ("a", "b"))
    held = claim(job, worker="w", lease=60)
    assert held is not None
    with fenced(held):
        with no_warning():
            Job.objects.using(alias).get(pk=job.pk).save()
        with pytest.warns(UnlockedSaveWarning, match=rf"^lockkit_tests\.Job pk={other.pk} "):
            Job.objects.using(alias).get(pk=other.pk).save()


# -- vendor-independent ----------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_sqlite_never_warns_its_scope_holds_the_database_write_lock() -> None:
    alias = "sqlite"
    _stock(alias, "a", "b")
    with lockkit.locked(alias) as scope, no_warning():
        scope.get(Stock, pk="a")
        Stock.objects.using(alias).get(pk="b").save()


def test_the_command_line_filter_resolves_the_category() -> None:
    code = "import warnings, lockkit; warnings.warn('unlocked', lockkit.UnlockedSaveWarning)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-W", "error::lockkit.UnlockedSaveWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 1
    assert "lockkit.errors.UnlockedSaveWarning: unlocked" in done.stderr


def test_force_refuses_what_is_not_a_flag() -> None:
    with pytest.raises(TypeError, match="value"):
        unlocked.force("yes")  # type: ignore[arg-type]


@VENDORS
def test_rows_a_prefetch_read_after_the_locking_statement_are_not_locked(alias: str) -> None:
    owner = Owner.objects.using(alias).create(name="o")
    first, second = (Item.objects.using(alias).create(name=n, owner=owner) for n in ("x", "y"))
    with lockkit.locked(alias) as scope:
        scope.get(Item, pk=first.pk)
        (locked_owner,) = scope.lock(Owner.objects.prefetch_related("item_set"))
        prefetched = {
            item.pk: item for item in locked_owner.item_set.all()
        }  # a second SELECT, without FOR UPDATE
        with no_warning():
            prefetched[first.pk].save()  # locked by the scope's get()
        with pytest.warns(UnlockedSaveWarning, match=rf"^lockkit_tests\.Item pk={second.pk} saved"):
            prefetched[second.pk].save()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_each_alias_is_checked_against_its_own_scope() -> None:
    Stock.objects.bulk_create([Stock(sku="a", available=5), Stock(sku="c", available=5)])
    Stock.objects.using("other").bulk_create([Stock(sku="b", available=5)])
    with lockkit.locked("default") as scope, no_warning():
        scope.get(Stock, pk="a")
        Stock.objects.using("other").get(pk="b").save()  # another database, and no scope there
    with lockkit.locked("default") as outer:
        outer.get(Stock, pk="a")
        with lockkit.locked("other") as inner:
            with no_warning():
                Stock.objects.using("other").get(
                    pk="b"
                ).save()  # the scope on "other" locked no Stock row yet (and is for no model)
            with lockkit.locked(
                "other", model=Stock
            ):  # nested, for Stock: the transaction has locked nothing yet
                with pytest.warns(UnlockedSaveWarning, match=_nothing_locked("b", "other")):
                    Stock.objects.using("other").get(pk="b").save()
            inner.get(Stock, pk="b")
            with no_warning():
                Stock.objects.using("other").get(pk="b").save()
            with pytest.warns(UnlockedSaveWarning, match=_message("c", "default")):
                Stock.objects.get(pk="c").save()


@VENDORS
def test_the_awaitable_form_warns_too(alias: str) -> None:
    _stock(alias, "a", "b")

    @lockkit.locked_operation(using=alias)
    def reserve() -> None:
        lockkit.current_scope().get(Stock, pk="a")
        Stock.objects.using(alias).get(pk="b").save()

    with pytest.warns(UnlockedSaveWarning, match=_message("b", alias)):
        asyncio.run(reserve.acall())


# -- a scope that locked nothing (issue 33, item 7) -----------------------------------------------------------------


def _nothing_locked(sku: str, alias: str) -> str:
    return (
        rf"^lockkit_tests\.Stock pk='{sku}' saved in a locked scope on '{alias}' that has locked nothing: "
        "an unlocked read-modify-write"
    )


@VENDORS
def test_a_save_in_a_locked_operation_that_locked_nothing_warns(alias: str) -> None:
    """The seed's bug: ``@locked_operation(model=Stock)`` reads a Stock without the lock and saves it."""
    _stock(alias, "a")

    @lockkit.locked_operation(using=alias, model=Stock)
    def reserve(sku: str) -> None:
        stock = Stock.objects.using(alias).get(pk=sku)  # no FOR UPDATE: the lock was forgotten
        stock.available -= 1
        with pytest.warns(UnlockedSaveWarning, match=_nothing_locked(sku, alias)) as caught:
            stock.save()
        (warning,) = caught.list
        assert warning.filename == __file__
        assert "scope.get(Model, pk=...)" in str(warning.message)

    reserve("a")
    assert Stock.objects.using(alias).get(pk="a").available == 4


@VENDORS
def test_a_scope_that_locked_nothing_does_not_warn_for_rows_it_created_or_locked_later(alias: str) -> None:
    _stock(alias, "a")
    with lockkit.locked(alias, model=Stock) as scope, no_warning():
        created = Stock.objects.using(alias).create(sku="n1", available=1)
        created.available = 2
        created.save()  # the scope's own new row: no other session can see it
        Stock.objects.using(alias).get(pk="n1").save()  # read back: still the scope's own row
        locked = scope.get(Stock, pk="a")
        locked.save()
        created.save()  # still its own row, now that the scope has locked other Stock rows
    with lockkit.locked(alias, model=Stock):  # an existing row now, in a scope that locked nothing
        with pytest.warns(UnlockedSaveWarning, match=_nothing_locked("n1", alias)):
            Stock.objects.using(alias).get(pk="n1").save()
    with lockkit.locked(alias), no_warning():  # a scope for no model that locks nothing: SERIALIZABLE, say
        Stock.objects.using(alias).get(pk="n1").save()
    with lockkit.locked(alias, model=Item), no_warning():  # not the scope's model
        Stock.objects.using(alias).get(pk="n1").save()


@VENDORS
def test_a_scope_holding_an_advisory_or_table_lock_does_not_warn(alias: str) -> None:
    _stock(alias, "a")
    with lockkit.locked(alias, model=Stock) as scope, no_warning():
        scope.advisory_lock("stock:a")  # the application's own lock protects the row
        Stock.objects.using(alias).get(pk="a").save()
    if alias == "mariadb":
        return  # lock_table() is refused there (LOCK TABLES commits the transaction)
    with lockkit.locked(alias, model=Stock) as scope, no_warning():
        scope.lock_table(Stock, mode="SHARE ROW EXCLUSIVE")
        Stock.objects.using(alias).get(pk="a").save()


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_sqlite_scope_that_locked_nothing_does_not_warn_it_holds_the_write_lock() -> None:
    _stock("sqlite", "a")
    with lockkit.locked("sqlite", model=Stock), no_warning():
        Stock.objects.using("sqlite").get(pk="a").save()
