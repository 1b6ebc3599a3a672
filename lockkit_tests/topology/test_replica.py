"""A primary and a real hot standby (pg_basebackup, streaming), with a router sending reads to the standby.

lockkit resolves a locked operation to ``router.db_for_write`` (the primary); a scope opened on the standby
fails fast with ``ReadOnlyDatabase``, never retried and never sleeping.
"""

from __future__ import annotations

import time

import pytest
from django.db import connections
from django.test import override_settings

import lockkit
from lockkit import RetryEvent, RetryPolicy
from lockkit.testing import assert_single_alias
from lockkit_tests.models import Stock
from lockkit_tests.support import topology

MISSING = topology.missing()

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=f"no primary/standby topology: {MISSING}"),
    pytest.mark.django_db(transaction=True, databases=["default", "primary", "replica"]),
]


@pytest.fixture(autouse=True)
def _replica_caught_up() -> None:
    """The test database was created on the primary just before: let the standby replay it first."""
    topology.wait_for_replay()


ROUTED = override_settings(DATABASE_ROUTERS=["lockkit_tests.support.topology.PrimaryReplicaRouter"])


def test_replica_is_a_streaming_hot_standby() -> None:
    with connections["replica"].cursor() as cursor:
        cursor.execute("SELECT pg_is_in_recovery(), current_database()")
        assert cursor.fetchone() == (True, connections["primary"].settings_dict["NAME"])
    with connections["primary"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
        assert cursor.fetchone() == (1,)


@ROUTED
def test_locked_operation_resolves_to_the_primary_and_the_replica_sees_the_commit() -> None:
    Stock.objects.create(sku="widget", available=3)  # a write: the router sends it to the primary

    @lockkit.locked_operation(model=Stock)
    def reserve() -> str:
        scope = lockkit.current_scope()
        item = scope.get(Stock, pk="widget")
        item.available -= 1
        item.save(using=scope.alias)
        return scope.alias

    with assert_single_alias("primary") as log:
        alias = reserve()
    assert alias == "primary"
    assert any("FOR UPDATE" in sql for sql in log.on("primary"))
    topology.wait_for_replay()
    assert Stock.objects.get(pk="widget").available == 2  # a read: the router sends it to the replica
    assert Stock.objects.db_manager("replica").get(pk="widget").available == 2


@ROUTED
def test_scope_on_the_replica_fails_fast_with_read_only_database_never_retried() -> None:
    Stock.objects.create(sku="widget", available=3)
    topology.wait_for_replay()
    events: list[RetryEvent] = []
    policy = RetryPolicy(
        attempts=5,
        # every kind that may be retried
        retry_on=frozenset(lockkit.Failure)
        - {lockkit.Failure.READ_ONLY, lockkit.Failure.DATABASE_MISCONFIGURED},
        wait_initial=1,
        wait_max=1,
        before_retry=events.append,
        on_give_up=events.append,
    )

    @lockkit.locked_operation("replica", retry=policy)
    def reserve() -> None:
        # Bound explicitly: the router sends Stock's writes to "primary", so the bare model is refused up front.
        lockkit.current_scope().get(Stock.objects.using("replica"), pk="widget")

    # The scope's first statement fails: it carries the opening, which reads pg_current_xact_id() (to resolve a
    # lost COMMIT), and a hot standby refuses that with 25006 before the statement runs. Nothing is left open.
    with pytest.raises(lockkit.ReadOnlyDatabase), lockkit.locked("replica"):
        with connections["replica"].cursor() as cursor:
            cursor.execute("SELECT 1")
        pytest.fail("a scope on the standby must not run a statement")  # pragma: no cover
    assert not connections["replica"].in_atomic_block
    started = time.monotonic()
    with pytest.raises(lockkit.ReadOnlyDatabase) as caught:
        reserve()
    elapsed = time.monotonic() - started
    assert caught.value.sqlstate == "25006"
    assert caught.value.alias == "replica"
    assert caught.value.attempts == 1
    assert events == []  # no retry, no give-up: READ_ONLY is not retryable
    assert elapsed < 0.9  # one wait would have been 1 s
    assert not connections["replica"].in_atomic_block


def test_capability_report_flags_the_standby() -> None:
    from lockkit.capabilities import capabilities

    assert capabilities("primary").warnings == ()
    assert capabilities("replica").warnings == (
        "a read-only hot standby: locked scopes here raise ReadOnlyDatabase; route writes elsewhere",
    )
