"""Tests of lockkit.testing itself: each helper does its job, and fails when it should."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from django.db import OperationalError, connections, transaction

from lockkit import LockNotAvailable, LockTimeout
from lockkit.backends import backend_for
from lockkit.testing import (
    ContentionTimeout,
    Holder,
    LockWaitMonitor,
    NothingLocked,
    assert_single_alias,
    backend_pid,
    blocked_by,
    hold_lock,
    in_thread,
    run_concurrently,
    wait_until_blocked,
)
from lockkit_tests.models import Item, RemoteItem
from lockkit_tests.support.vendors import vendor_params

pytestmark = pytest.mark.contention
BOTH = vendor_params()


def _nowait_value(alias: str, pk: int) -> int:
    """Read a row with FOR UPDATE NOWAIT in this thread: OperationalError if another session holds it."""
    with transaction.atomic(using=alias):
        return Item.objects.using(alias).select_for_update(nowait=True).get(pk=pk).value


def _locked_value(alias: str, pk: int) -> int:
    """Wait for the row's lock (bounded by the test database's settings), then return the value it sees."""
    with transaction.atomic(using=alias):
        return Item.objects.using(alias).select_for_update().get(pk=pk).value


def _session_gone(alias: str, pid: int) -> bool:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            backend_for(connections[alias]).sessions.contention_sql(connections[alias]).session_exists, [pid]
        )
        (count,) = cursor.fetchone()
    return int(count) == 0


def _wait_session_gone(alias: str, pid: int, timeout: float = 5.0) -> bool:
    """Disconnection is asynchronous on the server: poll until the session has left, with a deadline."""
    deadline = time.monotonic() + timeout
    while not _session_gone(alias, pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# -- hold_lock -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alias", BOTH)
def test_hold_lock_holds_on_its_own_session_from_the_main_thread(alias: str) -> None:
    item = Item.objects.using(alias).create(name="a", value=1)
    with hold_lock(item) as holder:
        assert holder.alias == alias
        assert holder.pid != backend_pid(alias)
        assert [row.pk for row in holder.rows] == [item.pk]
        with pytest.raises(OperationalError):
            _nowait_value(alias, item.pk)
    assert holder.released
    assert _nowait_value(alias, item.pk) == 1
    assert _wait_session_gone(alias, holder.pid)


@pytest.mark.parametrize("alias", BOTH)
def test_hold_lock_rolls_back_by_default_and_commits_on_request(alias: str) -> None:
    item = Item.objects.using(alias).create(name="a", value=1)
    rows = Item.objects.using(alias).filter(pk=item.pk)
    with hold_lock(item) as holder:
        assert holder.run(lambda: rows.update(value=2)) == 1
    assert Item.objects.using(alias).get(pk=item.pk).value == 1
    with hold_lock(item) as holder:
        holder.run(lambda: rows.update(value=3))
        holder.release(commit=True)
        assert holder.released
        assert _nowait_value(alias, item.pk) == 3
    assert Item.objects.using(alias).get(pk=item.pk).value == 3


@pytest.mark.parametrize("alias", BOTH)
def test_hold_lock_run_reraises_what_the_function_raised(alias: str) -> None:
    item = Item.objects.using(alias).create(name="a", value=1)

    def boom() -> None:
        raise KeyError("inside the holder")

    with hold_lock(item) as holder, pytest.raises(KeyError, match="inside the holder"):
        holder.run(boom)


@pytest.mark.django_db(transaction=True)
def test_hold_lock_nowait_on_a_held_row_raises_lock_not_available() -> None:
    item = Item.objects.create(name="a", value=1)
    with hold_lock(item), pytest.raises(LockNotAvailable) as caught, hold_lock(item, nowait=True):
        pytest.fail("the second holder must not get the lock")  # pragma: no cover
    assert caught.value.alias == "default"


@pytest.mark.django_db(transaction=True)
def test_hold_lock_waits_a_bounded_time_for_a_held_row() -> None:
    item = Item.objects.create(name="a", value=1)
    started = time.monotonic()
    with hold_lock(item), pytest.raises(LockTimeout), hold_lock(item, timeout=0.3):
        pytest.fail("the second holder must not get the lock")  # pragma: no cover
    assert time.monotonic() - started < 5


@pytest.mark.django_db(transaction=True)
def test_hold_lock_raises_when_the_block_outlives_its_timeout() -> None:
    item = Item.objects.create(name="a", value=1)
    block = hold_lock(item, timeout=0.2)
    holder = block.__enter__()
    assert holder.thread is not None
    holder.thread.join(5)  # the holder gives the lock up by itself after 0.2 s
    assert holder.expired
    with pytest.raises(ContentionTimeout, match="released early"):
        block.__exit__(None, None, None)
    assert _nowait_value("default", item.pk) == 1


@pytest.mark.django_db(transaction=True)
def test_hold_lock_timeout_caps_the_whole_hold_even_with_run_calls() -> None:
    item = Item.objects.create(name="a", value=1)
    block = hold_lock(item, timeout=0.5)
    holder = block.__enter__()
    assert holder.thread is not None
    deadline = time.monotonic() + 3
    while not holder.expired and time.monotonic() < deadline:
        try:
            holder.run(lambda: None)  # activity must not extend the hold
        except (RuntimeError, ContentionTimeout):
            break
        holder.thread.join(0.1)
    holder.thread.join(5)
    assert holder.expired
    assert time.monotonic() < deadline  # it ended near 0.5 s, not after the 3 s of run() calls
    with pytest.raises(ContentionTimeout):
        block.__exit__(None, None, None)
    assert _nowait_value("default", item.pk) == 1


@pytest.mark.django_db(transaction=True)
def test_hold_lock_releases_when_the_block_raises() -> None:
    item = Item.objects.create(name="a", value=1)
    with pytest.raises(ZeroDivisionError), hold_lock(item) as holder:
        _ = 1 / 0
    assert holder.released
    assert _nowait_value("default", item.pk) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("target", "kwargs", "error", "match"),
    [
        (Item(name="unsaved"), {}, ValueError, "unsaved"),
        (42, {}, TypeError, "target"),
        (Item, {"using": "nope"}, ValueError, "using"),
        (Item, {"nowait": 1}, TypeError, "nowait"),
        (Item, {"timeout": 0}, ValueError, "timeout"),
    ],
)
def test_hold_lock_refuses_bad_input_before_any_sql(
    target: Any, kwargs: dict[str, Any], error: type[Exception], match: str, django_assert_num_queries: Any
) -> None:
    with django_assert_num_queries(0), pytest.raises(error, match=match), hold_lock(target, **kwargs):
        pytest.fail("must not be reached")  # pragma: no cover


@pytest.mark.django_db(transaction=True)
def test_hold_lock_refuses_a_target_its_session_cannot_see() -> None:
    with pytest.raises(NothingLocked, match="matched no rows"), hold_lock(Item.objects.filter(pk=-1)):
        pytest.fail("must not be reached")  # pragma: no cover
    # A TestCase's rows: written in a transaction the holder's session cannot see (see test_testing_plugin).
    with transaction.atomic():
        item = Item.objects.create(name="uncommitted", value=1)
        with pytest.raises(NothingLocked, match=r"TransactionTestCase or django_db\(transaction=True\)"):
            with hold_lock(item):
                pytest.fail("must not be reached")  # pragma: no cover


@pytest.mark.parametrize("alias", BOTH)
@pytest.mark.parametrize("write", ["update", "insert"])
def test_hold_lock_on_rows_the_callers_own_transaction_holds_fails_at_once(alias: str, write: str) -> None:
    """The holder would wait for the test's own uncommitted transaction until its timeout: told at once instead.

    An update locks the row on every vendor; MariaDB's holder also waits for a row the caller inserted (a
    ``TestCase``'s rows), where PostgreSQL's sees no row.
    """
    committed = Item.objects.using(alias).create(name="committed", value=1)
    with transaction.atomic(using=alias):
        if write == "update":
            Item.objects.using(alias).filter(pk=committed.pk).update(value=2)
            target = committed
        else:
            target = Item.objects.using(alias).create(name="uncommitted", value=1)
        invisible = write == "insert" and connections[alias].vendor == "postgresql"
        match = "matched no rows" if invisible else r"locked by the test's own session \(\d+\)"
        with pytest.raises(NothingLocked, match=match), hold_lock(target, timeout=20):
            pytest.fail("must not be reached")  # pragma: no cover
        # The caller's transaction is untouched: its write is there, and it commits.
        assert Item.objects.using(alias).get(pk=target.pk).value == (2 if write == "update" else 1)
    assert Item.objects.using(alias).filter(pk=target.pk).exists()
    # The holder's wait was cancelled: nothing waits for this session. MariaDB's lock views are a cache, refreshed
    # when last read more than 0.1 s before: read again no sooner.
    own, deadline = backend_pid(alias), time.monotonic() + 5
    while blocked_by(own, using=alias) and time.monotonic() < deadline:
        time.sleep(0.15)
    assert blocked_by(own, using=alias) == []


# -- wait_until_blocked / blocked_by -------------------------------------------------------------------------


@pytest.mark.parametrize("alias", BOTH)
def test_wait_until_blocked_returns_the_waiting_session(alias: str) -> None:
    item = Item.objects.using(alias).create(name="a", value=1)
    pids: list[int] = []

    def contender() -> int:
        pids.append(backend_pid(alias))
        return _locked_value(alias, item.pk)

    with hold_lock(item) as holder:
        assert blocked_by(holder) == []
        call = in_thread(contender)
        waiting = wait_until_blocked(holder, contenders=call)
        assert waiting == pids
        assert blocked_by(holder) == pids
        assert not call.done()
        holder.run(lambda: Item.objects.using(alias).filter(pk=item.pk).update(value=5))
        holder.release(commit=True)
    assert call.result(timeout=10) == 5


@pytest.mark.parametrize("alias", BOTH)
def test_wait_until_blocked_sees_contenders_queued_behind_each_other(alias: str) -> None:
    item = Item.objects.using(alias).create(name="a", value=1)
    with hold_lock(item) as holder:
        calls = [in_thread(_locked_value, alias, item.pk) for _ in range(2)]
        assert len(wait_until_blocked(holder, count=2, contenders=calls)) == 2
    assert [call.result(timeout=10) for call in calls] == [1, 1]


@pytest.mark.parametrize("alias", BOTH)
def test_wait_until_blocked_times_out_quickly_when_nobody_is_blocked(alias: str) -> None:
    item = Item.objects.using(alias).create(name="a", value=1)
    with hold_lock(item) as holder:
        started = time.monotonic()
        with pytest.raises(ContentionTimeout, match="0 session"):
            wait_until_blocked(holder, timeout=0.3)
        assert 0.3 <= time.monotonic() - started < 3


@pytest.mark.django_db(transaction=True)
def test_wait_until_blocked_fails_at_once_when_the_contender_ends_without_blocking() -> None:
    item = Item.objects.create(name="a", value=1)
    with hold_lock(item) as holder:
        call = in_thread(_nowait_value, "default", item.pk)  # NOWAIT: fails instead of waiting
        started = time.monotonic()
        with pytest.raises(ContentionTimeout, match=r"finished without blocking.*OperationalError"):
            wait_until_blocked(holder, contenders=call, timeout=30)
        assert time.monotonic() - started < 10


@pytest.mark.django_db(transaction=True)
def test_wait_until_blocked_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="count"):
        wait_until_blocked(1, count=0)
    with pytest.raises(TypeError, match="holder"):
        wait_until_blocked("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        wait_until_blocked(1, timeout=-1)
    with pytest.raises(TypeError, match="contenders"):
        wait_until_blocked(1, contenders=[object()])  # type: ignore[list-item]


# -- run_concurrently / in_thread ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_concurrently_runs_callers_together_on_their_own_sessions() -> None:
    together = threading.Barrier(3)

    def caller(tag: str) -> tuple[str, int]:
        together.wait(5)  # passes only if all three callers run at the same time
        return tag, backend_pid("default")

    outcomes = run_concurrently(caller, 3, args=[("a",), ("b",), ("c",)], timeout=10)
    assert [outcome.index for outcome in outcomes] == [0, 1, 2]
    assert all(outcome.ok for outcome in outcomes)
    results = [outcome.unwrap() for outcome in outcomes]
    assert [tag for tag, _ in results] == ["a", "b", "c"]
    pids = {pid for _, pid in results}
    assert len(pids) == 3
    assert backend_pid("default") not in pids
    assert all(_wait_session_gone("default", pid) for pid in pids)  # each caller closed its connection


@pytest.mark.django_db(transaction=True)
def test_run_concurrently_surfaces_an_assertion_failed_in_a_thread() -> None:
    def caller(i: int) -> int:
        assert i != 1, "caller 1 disagrees"
        return i

    outcomes = run_concurrently(caller, 3, args=[(0,), (1,), (2,)])
    assert [outcome.result for outcome in outcomes] == [0, None, 2]
    assert isinstance(outcomes[1].error, AssertionError)
    with pytest.raises(AssertionError, match="caller 1 disagrees"):
        outcomes[1].unwrap()
    with pytest.raises(AssertionError, match="caller 1 disagrees"):
        run_concurrently(caller, 3, args=[(0,), (1,), (2,)], reraise=True)


@pytest.mark.parametrize("alias", BOTH)
def test_run_concurrently_raises_quickly_on_a_stuck_caller_and_cancels_its_wait(alias: str) -> None:
    item = Item.objects.using(alias).create(name="a", value=1)
    with hold_lock(item) as holder:
        started = time.monotonic()
        with pytest.raises(ContentionTimeout, match="1 of 2 caller"):
            run_concurrently(
                lambda stuck: _locked_value(alias, item.pk) if stuck else 0,
                2,
                args=[(True,), (False,)],
                timeout=0.5,
            )
        assert time.monotonic() - started < 5
        # The stuck caller's lock wait was cancelled (pg_cancel_backend, KILL QUERY): nobody waits any more.
        deadline = time.monotonic() + 5
        while blocked_by(holder) and time.monotonic() < deadline:
            time.sleep(0.15)  # InnoDB's lock tables refresh after 100 ms without a read
        assert blocked_by(holder) == []


@pytest.mark.django_db(transaction=True)
def test_run_concurrently_explains_rows_its_callers_cannot_see() -> None:
    # A TestCase's rows: written in a transaction the callers' sessions cannot see (see test_testing_plugin).
    hint = r"TransactionTestCase or django_db\(transaction=True\)"
    with transaction.atomic():
        pk = Item.objects.create(name="uncommitted", value=1).pk
        (outcome,) = run_concurrently(lambda: Item.objects.get(pk=pk).value, 1)
        assert isinstance(outcome.error, Item.DoesNotExist)
        assert len(outcome.error.__notes__) == 1
        assert (
            "run_concurrently: caller 0 did not find the row in its own session" in outcome.error.__notes__[0]
        )
        with pytest.raises(Item.DoesNotExist) as raised:
            run_concurrently(lambda: Item.objects.get(pk=pk).value, 2, reraise=True)
        assert any(re.search(hint, note) for note in raised.value.__notes__)
        # in_thread's result(): the same explanation, once however often it is asked for.
        call = in_thread(lambda: Item.objects.get(pk=pk).value)
        for _ in range(2):
            with pytest.raises(Item.DoesNotExist) as raised:
                call.result(10)
        assert [re.search(hint, note) is not None for note in raised.value.__notes__] == [True]
        transaction.set_rollback(True)
    # Outside any transaction of the test's thread a missing row is just missing: no explanation added.
    (outcome,) = run_concurrently(lambda: Item.objects.get(pk=pk).value, 1)
    assert isinstance(outcome.error, Item.DoesNotExist)
    assert getattr(outcome.error, "__notes__", []) == []
    # Once committed, the callers see the row: the next call works.
    Item.objects.create(pk=pk, name="committed", value=7)
    assert [o.unwrap() for o in run_concurrently(lambda: Item.objects.get(pk=pk).value, 2)] == [7, 7]


@pytest.mark.django_db(transaction=True)
def test_run_concurrently_raises_on_a_caller_stuck_outside_the_database() -> None:
    never = threading.Event()
    try:
        with pytest.raises(ContentionTimeout):
            run_concurrently(lambda: never.wait(30), 1, timeout=0.2)
    finally:
        never.set()


def test_run_concurrently_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="n must"):
        run_concurrently(print, 0)
    with pytest.raises(TypeError, match="n must"):
        run_concurrently(print, "2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="func"):
        run_concurrently(42, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="args"):
        run_concurrently(print, 2, args=[(1,)])
    with pytest.raises(TypeError, match="args"):
        run_concurrently(print, 1, args=[[1]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="timeout"):
        run_concurrently(print, 1, timeout=0)


def test_in_thread_returns_the_result_or_reraises() -> None:
    def add(a: int, b: int = 0) -> int:
        return a + b

    assert in_thread(add, 1, b=2).result(timeout=5) == 3
    empty: dict[str, int] = {}
    with pytest.raises(KeyError):
        in_thread(empty.__getitem__, "missing").result(timeout=5)
    never = threading.Event()
    call = in_thread(never.wait, 30)
    try:
        with pytest.raises(ContentionTimeout):
            call.result(timeout=0.1)
    finally:
        never.set()
    assert call.join(5)


# -- LockWaitMonitor ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("alias", BOTH)
def test_lock_wait_monitor_sees_who_waited_for_whom(alias: str) -> None:
    item = Item.objects.using(alias).create(name="a", value=1)
    pids: list[int] = []

    def contender() -> int:
        pids.append(backend_pid(alias))
        return _locked_value(alias, item.pk)

    with LockWaitMonitor(alias, interval=0.005) as monitor:
        assert monitor.polls >= 1  # started: its first read is done
        assert monitor.waits == []
        with hold_lock(item) as holder:
            call = in_thread(contender)
            wait_until_blocked(holder, contenders=call)
            deadline = time.monotonic() + 5
            while pids[0] not in monitor.waiting_sessions() and time.monotonic() < deadline:
                time.sleep(0.05)
        assert call.result(timeout=10) == 1
    seen = [wait for wait in monitor.waits if wait.waiting == pids[0]]
    assert seen
    assert {wait.holder for wait in seen} == {holder.pid}
    assert {wait.kind for wait in seen} <= {"transactionid", "tuple", "RECORD"}
    assert monitor.peak() == 1
    assert 0 < monitor.mean_waiting() < 1
    assert monitor.mean_waiting(start=time.time() + 60) == 0.0
    assert holder.pid not in monitor.waiting_sessions()


def test_lock_wait_monitor_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="interval"):
        LockWaitMonitor(interval=0)
    with pytest.raises(ValueError, match="using"):
        LockWaitMonitor("nope")


# -- assert_single_alias -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_assert_single_alias_passes_when_every_query_is_on_the_alias() -> None:
    with assert_single_alias("other") as log, transaction.atomic(using="other"):
        RemoteItem.objects.create(name="r")
        assert RemoteItem.objects.count() == 1
    assert len(log.on("other")) >= 2
    assert log.strays == []


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_assert_single_alias_fails_when_a_query_hits_another_alias() -> None:
    def strays_to_other() -> None:
        with assert_single_alias("default"):
            Item.objects.create(name="here")
            RemoteItem.objects.count()  # routed to "other"

    with pytest.raises(AssertionError, match=r"1 query\(ies\) ran on another alias than 'default'") as caught:
        strays_to_other()
    assert "on 'other'" in str(caught.value)
    assert "COUNT" in str(caught.value).upper()
    assert Item.objects.filter(name="here").count() == 1  # the block itself ran to its end


def test_assert_single_alias_refuses_an_unknown_alias() -> None:
    with pytest.raises(ValueError, match="alias"), assert_single_alias("nope"):
        pass  # pragma: no cover


def test_holder_is_exported() -> None:
    assert Holder.__module__ == "lockkit.testing.holding"
