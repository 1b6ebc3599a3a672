"""One alias per operation: explicit, a callable of the call's arguments, or the router's write database."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit.testing import assert_single_alias, run_concurrently
from lockkit_tests.models import RemoteItem, Stock

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "other"]), pytest.mark.contention]


@lockkit.locked_operation(model=RemoteItem)
def bump_remote(pk: int) -> int:
    item = lockkit.current_scope().get(RemoteItem, pk=pk)
    item.value += 1
    item.save(update_fields=["value"])
    return item.value


def test_model_operation_runs_entirely_on_the_routers_write_alias() -> None:
    item = RemoteItem.objects.create(name="r", value=1)
    assert RemoteItem.objects.db == "other"
    with CaptureQueriesContext(connections["other"]) as sent, assert_single_alias("other") as log:
        assert bump_remote(item.pk) == 2
    statements = " ".join(log.on("other")).upper()
    assert "FOR UPDATE" in statements  # the lock...
    assert "UPDATE " in statements  # ...and the write ran on the router's alias...
    # ...and so did the timeout: the scope's opening, sent on that alias before the locking statement.
    opening = next(q["sql"] for q in sent.captured_queries if q["sql"] != "BEGIN")
    assert opening.startswith("BEGIN; SELECT set_config('lock_timeout', '5000ms', true)")
    assert log.on("default") == []
    assert RemoteItem.objects.using("other").get(pk=item.pk).value == 2
    assert not RemoteItem.objects.using("default").exists()


def test_queryset_bound_to_another_alias_is_refused_before_sql() -> None:
    with lockkit.locked("default") as scope, CaptureQueriesContext(connections["other"]) as other_queries:
        with CaptureQueriesContext(connections["default"]) as default_queries:
            with pytest.raises(lockkit.AliasMismatch, match="'other'"):
                scope.lock(RemoteItem.objects.using("other").filter(pk=1))
            with pytest.raises(lockkit.AliasMismatch):
                scope.get(RemoteItem.objects.db_manager("other").all(), pk=1)
        assert len(default_queries) == 0
    assert len(other_queries) == 0


def test_unbound_queryset_of_an_unrouted_model_follows_the_scope_alias() -> None:
    Stock.objects.using("other").create(sku="on-other", available=5)
    with lockkit.locked("other") as scope:
        rows = scope.lock_all(Stock)  # no router has an opinion on Stock: the scope's alias wins
    assert [r.sku for r in rows] == ["on-other"]


def test_model_routed_elsewhere_is_refused_before_sql_on_both_aliases() -> None:
    """The router sends RemoteItem to "other": a scope on "default" must not query its table on "default"."""
    on_default = RemoteItem.objects.using("default").create(name="on-default", value=5)
    with lockkit.locked("default") as scope, CaptureQueriesContext(connections["other"]) as other_queries:
        with CaptureQueriesContext(connections["default"]) as default_queries:
            for call in (
                lambda: scope.lock(RemoteItem),
                lambda: scope.get(RemoteItem, pk=on_default.pk),
                lambda: scope.lock_all(RemoteItem, pks=[on_default.pk]),
                lambda: scope.lock(RemoteItem.objects.filter(pk=on_default.pk)),
                lambda: lockkit.lock(RemoteItem),
            ):
                with pytest.raises(lockkit.AliasMismatch) as caught:
                    call()
                message = str(caught.value)
                assert "'other'" in message  # both aliases
                assert "'default'" in message
                assert "locked(model=RemoteItem)" in message  # and the fix
        assert len(default_queries) == 0
        # Explicitly bound to the scope's alias, or read from it: taken as meant.
        assert [r.pk for r in scope.lock(RemoteItem.objects.using("default"))] == [on_default.pk]
        assert scope.get(on_default).name == "on-default"
    assert len(other_queries) == 0


def test_callable_alias_receives_the_call_arguments_and_threads_stay_apart() -> None:
    Stock.objects.using("default").create(sku="s", available=0)
    Stock.objects.using("other").create(sku="s", available=0)

    @lockkit.locked_operation(using=lambda tenant, sku: tenant)
    def bump(tenant: str, sku: str) -> str:
        scope = lockkit.current_scope()
        stock = scope.get(Stock, sku=sku)
        stock.available += 1
        stock.save(update_fields=["available"])
        return scope.alias

    tenants = ["default", "other"] * 4
    outcomes = run_concurrently(bump, 8, args=[(t, "s") for t in tenants], timeout=60)
    assert [o.result for o in outcomes] == tenants
    assert Stock.objects.using("default").get(sku="s").available == 4
    assert Stock.objects.using("other").get(sku="s").available == 4


def test_positional_callable_is_always_the_decorated_function() -> None:
    # Django's rule (as for atomic): a positional callable is decorated, with the options given alongside it;
    # an alias resolver is only ever passed as using=.
    def where(alias: str) -> tuple[str, float | None]:
        scope = lockkit.current_scope()
        return scope.alias, scope.lock_timeout

    decorated = lockkit.locked_operation(where, lock_timeout=1)
    assert decorated("other") == ("default", 1.0)
    resolved = lockkit.locked_operation(using=lambda alias: alias, lock_timeout=1)(where)
    assert resolved("other") == ("other", 1.0)


def test_callable_returning_unknown_alias_fails_before_sql() -> None:
    @lockkit.locked_operation(using=lambda: "nowhere")
    def op() -> None:
        raise AssertionError("must not run")

    with CaptureQueriesContext(connections["default"]) as queries, pytest.raises(ValueError, match="nowhere"):
        op()
    assert len(queries) == 0

    @lockkit.locked_operation(using=lambda: 42)  # type: ignore[arg-type, return-value]
    def op2() -> None:
        raise AssertionError("must not run")

    with pytest.raises(TypeError, match="alias"):
        op2()


def test_model_scope_context_manager(settings: Any) -> None:
    with lockkit.locked(model=RemoteItem) as scope:
        assert scope.alias == "other"
    with lockkit.locked(model=Stock) as scope:
        assert scope.alias == "default"  # the router has no opinion: default


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_lock_all_with_a_queryset_of_pks_stays_on_the_scope_alias() -> None:
    Stock.objects.create(sku="a", available=1)
    with lockkit.locked("default") as scope:
        with CaptureQueriesContext(connections["other"]) as other:
            with pytest.raises(lockkit.AliasMismatch):
                scope.lock_all(Stock, pks=Stock.objects.using("other").values("pk"))
            rows = scope.lock_all(Stock, pks=Stock.objects.filter(available=1).values("pk"))
        assert len(other) == 0
    assert [r.sku for r in rows] == ["a"]
