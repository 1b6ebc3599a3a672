"""Django's broken-transaction rules and ``update_or_create`` under contention, inside lockkit scopes."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import IntegrityError, connections, transaction
from django.db.transaction import TransactionManagementError

from lockkit import DeadlockDetected, LockNotAvailable, TransactionAborted, locked
from lockkit.testing import backend_pid, hold_lock, in_thread, run_concurrently, wait_until_blocked
from lockkit_tests.models import PeerReporter
from lockkit_tests.support.vendors import vendor_params

pytestmark = pytest.mark.contention
BOTH = vendor_params()


@pytest.mark.parametrize("alias", BOTH)
def test_no_query_runs_after_an_error_inside_a_scope(alias: str) -> None:
    reporters = PeerReporter.objects.using(alias)
    first = reporters.create(first_name="Archibald", last_name="Haddock")
    # PostgreSQL aborted the transaction; MariaDB rolled back the failed statement only, and Django's block is
    # marked for rollback. Either way the scope says so on exit rather than return as if it had committed
    # (issue 23, item 4).
    message = "duplicate key" if connections[alias].vendor == "postgresql" else "Duplicate entry"
    with pytest.raises(TransactionAborted, match=message), locked(alias) as scope:
        scope.get(PeerReporter, pk=first.pk)
        duplicate = PeerReporter(pk=first.pk, first_name="Cuthbert", last_name="Calculus")
        with pytest.raises(IntegrityError):
            duplicate.save(using=alias, force_insert=True)
        with pytest.raises(TransactionManagementError, match="until the end of the 'atomic' block") as caught:
            duplicate.save(using=alias, force_update=True)
        assert isinstance(caught.value.__cause__, IntegrityError)
    # The scope rolled back on exit, and the connection is usable again.
    assert not connections[alias].in_atomic_block
    assert reporters.get(pk=first.pk).last_name == "Haddock"


@pytest.mark.parametrize("alias", BOTH)
def test_a_failed_nested_scope_rolls_back_to_its_savepoint_only(alias: str) -> None:
    reporters = PeerReporter.objects.using(alias)
    nested: list[bool] = []

    def fail_inside() -> None:
        with locked(alias) as inner:
            nested.append(inner.nested)
            reporters.create(first_name="Haddock")
            raise ValueError("oops")

    with locked(alias) as outer:
        kept = reporters.create(first_name="Tintin")
        with pytest.raises(ValueError, match="oops"):
            fail_inside()
        assert nested == [True]
        assert outer.get(PeerReporter, pk=kept.pk).first_name == "Tintin"
        reporters.create(first_name="Milou")
    assert sorted(reporters.values_list("first_name", flat=True)) == ["Milou", "Tintin"]


@pytest.mark.parametrize("alias", BOTH)
def test_a_lock_failure_in_a_nested_scope_leaves_the_outer_transaction_usable(alias: str) -> None:
    reporters = PeerReporter.objects.using(alias)
    busy = reporters.create(first_name="Busy")
    with hold_lock(busy), locked(alias) as outer:
        with pytest.raises(LockNotAvailable), locked(alias, nowait=True) as inner:
            inner.get(PeerReporter, pk=busy.pk)
        written = reporters.create(first_name="After the failure")
        assert outer.alias == alias
    assert reporters.filter(pk=written.pk).exists()


@pytest.mark.parametrize("alias", BOTH)
def test_a_deadlock_in_a_nested_scope(alias: str) -> None:
    """Two sessions lock A then B and B then A; the victim's nested scope raises ``DeadlockDetected``.

    PostgreSQL rolls back to the nested scope's savepoint, so the victim's outer transaction goes on and
    commits. MariaDB rolls back the whole transaction, savepoints included (Django #22291): the outer scope
    can run no further query, commits nothing, and says so when it ends (``TransactionAborted``), although its
    body caught the nested scope's error and returned.
    """
    reporters = PeerReporter.objects.using(alias)
    first, second = reporters.create(first_name="A"), reporters.create(first_name="B")
    both_hold_one = threading.Barrier(2)

    def cross(mine: int, theirs: int) -> str:
        with locked(alias, lock_timeout=10) as outer:
            outer.get(PeerReporter, pk=mine)
            both_hold_one.wait(10)
            try:
                with locked(alias, lock_timeout=10) as inner:
                    inner.get(PeerReporter, pk=theirs)
            except DeadlockDetected:
                try:
                    reporters.filter(pk=mine).update(last_name="victim went on")
                except TransactionManagementError:
                    return "victim, transaction broken"
                return "victim, transaction usable"
            reporters.filter(pk=mine).update(last_name="winner")
            return "winner"

    outcomes = run_concurrently(cross, 2, args=[(first.pk, second.pk), (second.pk, first.pk)], timeout=30)
    last_names = sorted(reporters.values_list("last_name", flat=True))
    if connections[alias].vendor == "postgresql":
        assert sorted(outcome.unwrap() for outcome in outcomes) == ["victim, transaction usable", "winner"]
        assert last_names == ["victim went on", "winner"]
    else:
        assert sorted(str(outcome.result) for outcome in outcomes if outcome.error is None) == ["winner"]
        (aborted,) = [outcome.error for outcome in outcomes if outcome.error is not None]
        assert isinstance(aborted, TransactionAborted)
        assert "1213" in aborted.swallowed  # InnoDB's deadlock, which rolled the outer transaction back too
        assert last_names == ["", "winner"]


@pytest.mark.parametrize("alias", BOTH)
def test_update_or_create_holds_its_lock_until_it_commits(alias: str) -> None:
    """A concurrent update of another field waits for ``update_or_create``'s lock, then is not lost."""
    reporters = PeerReporter.objects.using(alias)
    john = reporters.create(first_name="John", last_name="Lennon", rank=1)
    session: list[int] = []
    holding, proceed = threading.Event(), threading.Event()

    def slow_rank() -> int:
        # Runs while update_or_create holds the row's lock, inside its transaction.
        session.append(backend_pid(alias))
        holding.set()
        assert proceed.wait(10), "the test never let update_or_create go on"
        return 2

    def update_or_create() -> bool:
        with locked(alias):
            # A callable default is evaluated while the row is locked (Django's own scenario).
            defaults: dict[str, Any] = {"rank": slow_rank}
            _, created = reporters.update_or_create(first_name="John", defaults=defaults)
            return created

    writer = in_thread(update_or_create)
    assert holding.wait(10), "update_or_create did not reach its defaults"
    renamer = in_thread(lambda: reporters.filter(pk=john.pk).update(last_name="NotLennon"))
    try:
        assert len(wait_until_blocked(session[0], using=alias, contenders=renamer)) == 1
        assert reporters.get(pk=john.pk).rank == 1  # not committed yet
    finally:
        proceed.set()
    assert writer.result(timeout=10) is False
    assert renamer.result(timeout=10) == 1
    john.refresh_from_db(using=alias)
    assert (john.rank, john.last_name) == (2, "NotLennon")


def test_update_or_create_inside_a_scope_uses_the_scopes_transaction() -> None:
    """Guard against a silent autocommit: inside a scope, update_or_create's atomic is a savepoint of it."""

    def create_then_fail() -> None:
        with transaction.atomic(), locked("default") as scope:
            assert scope.nested
            PeerReporter.objects.update_or_create(first_name="Ringo", defaults={"rank": 3})
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError, match="roll back"):
        create_then_fail()
    assert not PeerReporter.objects.filter(first_name="Ringo").exists()
