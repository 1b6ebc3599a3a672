"""django-pglock's ``pglock/tests/test_core.py``, ported onto lockkit: each test names the pglock test it ports.

Every scenario runs against the real database with real sessions in threads (``lockkit.testing.in_thread``), the
blocking observed where there is a wait (``wait_until_blocked``), and no mocks. Where pglock returns ``False`` or
raises a bare ``OperationalError``, lockkit raises its typed errors (``LockNotAvailable``, ``LockTimeout``); where
pglock's ``Return`` side effect keeps the transaction usable through a savepoint, lockkit's nested scope does the
same. The advisory-lock scenarios also run on MariaDB. ``test_advsiory_id`` is ported elsewhere.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, NotSupportedError, OperationalError, connections, transaction

import lockkit
from lockkit import (
    ConnectionLost,
    LockNotAvailable,
    LockTimeout,
    NotInLockedScope,
    PrioritizeFailed,
    TableLockMode,
    locked,
)
from lockkit.testing import backend_pid, in_thread, wait_until_blocked
from lockkit_tests.models import Item, Owner, Stock
from lockkit_tests.support.vendors import vendor_params

pytestmark = pytest.mark.contention
BOTH = vendor_params()
POSTGRESQL = pytest.mark.django_db(transaction=True)
MARIADB = next(param for param in BOTH if param.id == "mariadb")


# -- helpers ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def held_in_thread(take: Callable[[], contextlib.AbstractContextManager[Any]], alias: str) -> Iterator[int]:
    """Run ``take()`` in another thread's session and keep it entered until the block exits; yield its pid."""
    entered, release = threading.Event(), threading.Event()
    pid: dict[str, int] = {}

    def hold() -> None:
        try:
            with take():
                pid["pid"] = backend_pid(alias)
                entered.set()
                assert release.wait(30), "the test never released the holder"
        finally:
            connections.close_all()

    call = in_thread(hold)
    if not entered.wait(30):
        call.result(timeout=5)  # the holder's own failure
        pytest.fail("the holder did not take its lock within 30s")
    try:
        yield pid["pid"]
    finally:
        release.set()
        call.result(timeout=30)


def advisory_held_elsewhere(
    alias: str, key: Any, *, session: bool = False
) -> contextlib.AbstractContextManager[int]:
    """Hold advisory ``key`` from another session (transaction-scoped unless ``session``)."""
    return held_in_thread(
        lambda: lockkit.advisory_lock(key, using=alias, session=session, lock_timeout=10), alias
    )


@contextlib.contextmanager
def _table_scope(alias: str, mode: str, models: tuple[Any, ...]) -> Iterator[None]:
    with locked(alias, lock_timeout=10) as scope:
        scope.lock_table(*models, mode=mode)
        yield


def table_held_elsewhere(*models: Any, mode: str = "ACCESS EXCLUSIVE", alias: str = "default") -> Any:
    """Hold ``models``' tables in ``mode`` from another session's scope."""
    return held_in_thread(lambda: _table_scope(alias, mode, models), alias)


def free_now(alias: str, key: Any) -> bool:
    """Whether another session can take advisory ``key`` at once right now."""

    def attempt() -> bool:
        try:
            with lockkit.advisory_lock(key, using=alias, nowait=True):
                return True
        except LockNotAvailable:
            return False
        finally:
            connections.close_all()

    return in_thread(attempt).result(timeout=30)


def lock_timeout_setting(alias: str = "default") -> str:
    with connections[alias].cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        return str(cursor.fetchone()[0])


def session_alive(pid: int) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return bool(cursor.fetchone()[0])


# -- lock timeouts ---------------------------------------------------------------------------------------------


@POSTGRESQL
def test_nested_scopes_set_and_restore_the_lock_timeout() -> None:
    """Ports pglock's ``test_timeout``: nested timeouts apply and are put back, through failing savepoints too."""
    Stock.objects.create(sku="hello", available=1)
    server_default = lock_timeout_setting()
    with locked(lock_timeout=1):
        assert lock_timeout_setting() == "1s"
        with locked(lock_timeout=2):
            assert lock_timeout_setting() == "2s"
            with transaction.atomic():
                with locked(lock_timeout=3):
                    assert lock_timeout_setting() == "3s"
                assert lock_timeout_setting() == "2s"
                with locked(lock_timeout=4):
                    assert lock_timeout_setting() == "4s"
                    with pytest.raises(IntegrityError), locked(lock_timeout=5):
                        assert lock_timeout_setting() == "5s"
                        Stock.objects.create(sku="hello", available=1)
                    assert lock_timeout_setting() == "4s"
                # pglock's timeout(None) sets "no timeout"; lockkit's None keeps the enclosing bound.
                with locked(lock_timeout=None):
                    assert lock_timeout_setting() == "2s"
                with pytest.raises(IntegrityError), locked(lock_timeout=6):
                    Stock.objects.create(sku="hello", available=1)
                assert lock_timeout_setting() == "2s"
            assert lock_timeout_setting() == "2s"
        assert lock_timeout_setting() == "1s"
    # Transaction-scoped: nothing reaches the next user of the connection.
    assert lock_timeout_setting() == server_default
    assert Stock.objects.count() == 1


@POSTGRESQL
def test_bad_lock_timeouts_are_refused_before_any_sql() -> None:
    """Ports pglock's ``test_timeout_args``: no value, a string, zero and under a millisecond."""
    with pytest.raises(TypeError, match="lock_timeout"):
        locked(lock_timeout="1")  # type: ignore[call-overload]
    for bad in (0, -1, float("nan"), float("inf"), timedelta(0)):
        with pytest.raises(ValueError, match="lock_timeout"):
            locked(lock_timeout=bad)
    with pytest.raises(TypeError, match="lock_timeout"):
        locked(lock_timeout=True)
    assert connections["default"].connection is None or not connections["default"].in_atomic_block
    # Under a millisecond: pglock refuses it; lockkit rounds it up to 1 ms, never down to 0 ("no timeout").
    with locked(lock_timeout=timedelta(microseconds=1)):
        assert lock_timeout_setting() == "1ms"


# -- advisory locks --------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_bad_advisory_arguments_are_refused_before_any_sql() -> None:
    """Ports pglock's ``test_advisory_args``: no key, a key of the wrong type, bad options, bad decorator use."""
    with pytest.raises(TypeError, match="key"):
        lockkit.advisory_lock(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key"):
        lockkit.advisory_lock(timedelta(seconds=100))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key"):
        lockkit.advisory_lock("")
    with pytest.raises(TypeError, match="lock_timeout"):
        lockkit.advisory_lock("lock_id", lock_timeout="1")
    with pytest.raises(TypeError, match="nowait"):
        lockkit.advisory_lock("lock_id", nowait="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="session"):
        lockkit.advisory_lock("lock_id", session=1)  # type: ignore[arg-type]

    # pglock refuses a side effect that cannot apply to a decorator; lockkit refuses what it cannot wrap.
    async def coroutine() -> None:
        raise AssertionError

    with pytest.raises(TypeError, match="async"):
        lockkit.advisory_lock("lock_id")(coroutine)
    with pytest.raises(TypeError, match="callable"):
        lockkit.advisory_lock("lock_id")(42)  # type: ignore[arg-type]
    assert connections["default"].connection is None or not connections["default"].in_atomic_block


@pytest.mark.parametrize("alias", BOTH)
def test_nowait_advisory_lock_held_elsewhere_is_not_available(alias: str) -> None:
    """Ports pglock's ``test_advisory_no_wait``: ``timeout=0`` on a held key fails at once, then succeeds."""
    key = f"pglock-port:no-wait:{alias}"
    with advisory_held_elsewhere(alias, key, session=True):
        started = time.monotonic()
        with pytest.raises(LockNotAvailable) as caught, lockkit.advisory_lock(key, using=alias, nowait=True):
            pytest.fail("the block must not run")
        with (
            pytest.raises(LockNotAvailable),
            lockkit.advisory_lock(key, using=alias, nowait=True, session=True),
        ):
            pytest.fail("the block must not run")
        assert time.monotonic() - started < 2.0
        assert isinstance(caught.value, OperationalError)  # pglock's Raise: still an OperationalError
        assert caught.value.alias == alias
    with lockkit.advisory_lock(key, using=alias, nowait=True) as held:
        assert held.key.source == key


@pytest.mark.parametrize("alias", BOTH)
def test_advisory_lock_decorator_fails_fast_while_held_and_runs_once_free(alias: str) -> None:
    """Ports pglock's ``test_advisory_decorator``: decorated functions under a held key, then a free one.

    pglock's ``Skip`` side effect has no lockkit twin: the caller catches ``LockNotAvailable`` (shown here).
    """
    key = f"pglock-port:decorator:{alias}"
    calls: list[str] = []

    @lockkit.advisory_lock(key, using=alias, nowait=True)
    def in_a_scope() -> str:
        calls.append("scope")
        return "scope"

    @lockkit.advisory_lock(key, using=alias, nowait=True, session=True)
    def in_a_session() -> str:
        calls.append("session")
        return "session"

    def skipped() -> str | None:
        try:
            return in_a_scope()
        except LockNotAvailable:
            return None

    with advisory_held_elsewhere(alias, key):
        with pytest.raises(LockNotAvailable):
            in_a_scope()
        with pytest.raises(LockNotAvailable):
            in_a_session()
        assert skipped() is None
        assert calls == []
    assert in_a_scope() == "scope"
    assert in_a_session() == "session"
    assert calls == ["scope", "session"]


@pytest.mark.parametrize("alias", BOTH)
def test_advisory_lock_timeout_waits_then_fails_and_leaves_the_transaction_usable(alias: str) -> None:
    """Ports pglock's ``test_advisory_timeout``: a bounded wait, and the enclosing transaction still usable."""
    key = f"pglock-port:timeout:{alias}"
    with advisory_held_elsewhere(alias, key) as holder:
        # A real wait first: the database reports the contender blocked by the holder.
        def contender() -> None:
            try:
                with lockkit.advisory_lock(key, using=alias, lock_timeout=10):
                    pass
            finally:
                connections.close_all()

        call = in_thread(contender)
        assert wait_until_blocked(holder, using=alias, contenders=call, poll=0.15)
        started = time.monotonic()
        with pytest.raises(LockTimeout), lockkit.advisory_lock(key, using=alias, lock_timeout=0.2):
            pytest.fail("the block must not run")
        assert 0.15 <= time.monotonic() - started < 5
        with locked(alias) as outer:
            with (
                pytest.raises(LockTimeout),
                lockkit.advisory_lock(key, using=alias, lock_timeout=timedelta(milliseconds=200)),
            ):
                pytest.fail("the block must not run")
            # The failed nested lock rolled back its savepoint only: the outer transaction goes on.
            assert not Item.objects.using(alias).exists()
            Item.objects.using(alias).create(name="after the timeout")
            assert outer.alias == alias
    call.result(timeout=30)
    assert list(Item.objects.using(alias).values_list("name", flat=True)) == ["after the timeout"]


@pytest.mark.parametrize("alias", BOTH)
def test_a_session_lock_in_a_failing_transaction_is_released(alias: str) -> None:
    """Ports pglock's ``test_advisory_inside_transaction``: an error in the block leaves no lock behind."""
    key = f"pglock-port:in-transaction:{alias}"
    Stock.objects.using(alias).create(sku="hello", available=1)
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        with lockkit.advisory_lock(key, using=alias, session=True):
            assert not free_now(alias, key)
            Stock.objects.using(alias).create(sku="hello", available=1)
    assert free_now(alias, key)
    # The next call on this thread's connection works.
    with lockkit.advisory_lock(key, using=alias, nowait=True, session=True):
        assert Stock.objects.using(alias).count() == 1


@pytest.mark.parametrize("alias", BOTH)
def test_a_transaction_lock_is_held_until_the_transaction_ends(alias: str) -> None:
    """Ports pglock's ``test_advisory_xact``: ``xact=True`` locks last until the outermost transaction ends."""
    key = f"pglock-port:xact:{alias}"
    with advisory_held_elsewhere(alias, key):
        with pytest.raises(LockNotAvailable), lockkit.advisory_lock(key, using=alias, nowait=True):
            pass
    with locked(alias) as outer:
        with locked(alias) as inner:
            inner.advisory_lock(key)
        # The nested scope succeeded: its lock belongs to the enclosing transaction now.
        assert not free_now(alias, key)
        assert outer.alias == alias
    assert free_now(alias, key)


@pytest.mark.django_db(transaction=True)
def test_scope_and_lock_misuse_raise_clear_errors() -> None:
    """Ports pglock's ``test_advisory_xact_usage``: misuse outside or after a transaction is refused."""
    with pytest.raises(NotInLockedScope):
        lockkit.current_scope()
    with locked() as scope:
        held = scope.advisory_lock("pglock-port:usage")
        assert held.session is False  # a transaction lock: there is nothing to release by hand
    with pytest.raises(NotInLockedScope):
        scope.advisory_lock("pglock-port:usage")
    with pytest.raises(NotInLockedScope):
        scope.lock_table(Item, mode="SHARE")
    with locked() as scope:
        in_other_thread = in_thread(lambda: scope.advisory_lock("pglock-port:usage")).outcome(timeout=30)
    assert isinstance(in_other_thread.error, NotInLockedScope)


# -- table locks -----------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_bad_table_lock_arguments_are_refused_before_any_sql() -> None:
    """Ports pglock's ``test_model_args``: bad side effect/mode, no model, bad timeout, outside a transaction."""
    with pytest.raises(NotInLockedScope):
        lockkit.current_scope().lock_table(Item, mode="SHARE")
    with locked() as scope:
        with pytest.raises(TypeError):
            scope.lock_table(mode="SHARE")  # type: ignore[call-arg]
        with pytest.raises(ValueError, match="mode"):
            scope.lock_table(Item, mode="bad")
        with pytest.raises(ValueError, match="mode"):
            scope.lock_table(Item, mode="SHARE MODE; DROP TABLE lockkit_tests_item; --")
        with pytest.raises(TypeError, match="mode"):
            scope.lock_table(Item, mode=1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="nowait"):
            scope.lock_table(Item, mode="SHARE", nowait="1")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="model"):
            scope.lock_table("lockkit_tests.Nope", mode="SHARE")
        with pytest.raises(ValueError, match="model"):
            scope.lock_table("not a label", mode="SHARE")
        # Nothing was sent, so nothing doomed the scope: it goes on and commits.
        Item.objects.create(name="still usable")
    assert Item.objects.count() == 1


@POSTGRESQL
def test_nowait_table_lock_held_elsewhere_is_not_available() -> None:
    """Ports pglock's ``test_model_no_wait``: ``timeout=0`` is ``NOWAIT``; a model listed twice is fine."""
    with table_held_elsewhere(Item, Item):
        started = time.monotonic()
        with pytest.raises(LockNotAvailable) as caught, locked() as scope:
            scope.lock_table("lockkit_tests.Item", mode=TableLockMode.ACCESS_SHARE, nowait=True)
        # The scope's own nowait applies when lock_table() is not told otherwise.
        with pytest.raises(LockNotAvailable), locked(nowait=True) as scope:
            scope.lock_table(Item, mode="ACCESS SHARE")
        assert time.monotonic() - started < 2.0
        assert caught.value.sqlstate == "55P03"
        assert isinstance(caught.value, OperationalError)
    with locked() as scope:
        scope.lock_table(Item, Item, mode="ACCESS EXCLUSIVE", nowait=True)


@POSTGRESQL
def test_table_lock_waits_for_the_scope_lock_timeout_and_a_nested_failure_leaves_the_outer_usable() -> None:
    """Ports pglock's ``test_model_timeout``: a bounded wait, then the transaction is still usable."""
    with table_held_elsewhere(Item) as holder:

        def contender() -> int:
            try:
                with locked(lock_timeout=20) as scope:
                    scope.lock_table(Item, mode="SHARE")
                    return Item.objects.count()
            finally:
                connections.close_all()

        waiting = in_thread(contender)
        assert wait_until_blocked(holder, contenders=waiting)
        started = time.monotonic()
        with locked(lock_timeout=timedelta(milliseconds=200)) as outer:
            # lock_timeout=None: the nested scope keeps the enclosing 200 ms (the default would set 5 s).
            with pytest.raises(LockTimeout), locked(lock_timeout=None) as inner:
                inner.lock_table(Item, mode="SHARE")
            assert 0.15 <= time.monotonic() - started < 5
            # Like pglock's Return side effect (a savepoint): the outer transaction is not in an errored state.
            assert not Owner.objects.exists()
            Owner.objects.create(name="after the timeout")
            assert outer.nested is False
        assert not waiting.done()
    assert waiting.result(timeout=30) == 0
    assert Owner.objects.count() == 1


# -- prioritize ------------------------------------------------------------------------------------------------


@POSTGRESQL
def test_prioritize_terminates_the_blocking_session() -> None:
    """Ports pglock's ``test_prioritize``: the blocker is terminated, the prioritized lock is granted."""
    taken, release = threading.Event(), threading.Event()
    holder_pid: dict[str, int] = {}

    def blocker() -> None:
        try:
            with locked(lock_timeout=10) as scope:
                scope.lock_table(Item, mode="ACCESS EXCLUSIVE")
                holder_pid["pid"] = backend_pid()
                taken.set()
                assert release.wait(30)
                Item.objects.create(name="never committed")
        finally:
            connections.close_all()

    def prioritized() -> tuple[Any, ...]:
        try:
            with locked(lock_timeout=20) as scope, lockkit.prioritize(after=0.5, interval=0.05) as record:
                scope.lock_table("lockkit_tests.Item", mode="SHARE")
                assert Item.objects.count() == 0
            return record.signalled
        finally:
            connections.close_all()

    blocked = in_thread(blocker)
    assert taken.wait(30)
    winner = in_thread(prioritized)
    assert wait_until_blocked(holder_pid["pid"], contenders=winner) != []
    signalled = winner.result(timeout=30)
    assert [(s.pid, s.action, s.sent) for s in signalled] == [(holder_pid["pid"], "terminate", True)]
    release.set()
    terminated = blocked.outcome(timeout=30).error
    assert isinstance(terminated, ConnectionLost)
    assert isinstance(terminated, OperationalError)
    assert "terminat" in str(terminated)
    assert not Item.objects.exists()


@POSTGRESQL
def test_a_failing_prioritize_filter_is_raised_at_exit() -> None:
    """Ports pglock's ``test_prioritize_bad_side_effect``: an error in the watcher reaches the caller."""

    def bad_filter(session: Any) -> bool:
        raise KeyError("duration_gte is not a field")

    with table_held_elsewhere(Item) as holder:
        with pytest.raises(PrioritizeFailed, match="duration_gte") as caught:
            with (
                locked(lock_timeout=0.6) as scope,
                lockkit.prioritize(after=0, interval=0.05, only=bad_filter) as record,
            ):
                scope.lock_table(Item, mode="SHARE")
        assert isinstance(caught.value.__cause__, KeyError)
        # The body's own failure is kept as the context: the wait ran out because nobody was terminated.
        assert isinstance(caught.value.__context__, LockTimeout)
        assert record.signalled == ()
        assert session_alive(holder)


@POSTGRESQL
def test_a_lock_timeout_shorter_than_the_grace_period_fires_first() -> None:
    """Ports pglock's ``test_prioritize_timeout``: the lock timeout ends the wait before anyone is terminated."""
    with table_held_elsewhere(Item) as holder:
        with pytest.raises(LockTimeout, match="lock timeout"):
            with (
                locked(lock_timeout=timedelta(milliseconds=100)) as scope,
                lockkit.prioritize(after=0.3) as record,
            ):
                scope.lock_table(Item, mode="ACCESS EXCLUSIVE")
        assert record.signalled == ()
        assert session_alive(holder)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_bad_prioritize_arguments_are_refused_before_any_sql() -> None:
    """Ports pglock's ``test_prioritize_args``: a string interval, and lockkit's other arguments."""
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"interval": "1"}, TypeError, "interval"),
        ({"interval": 0}, ValueError, "interval"),
        ({"interval": 0.001}, ValueError, "interval"),
        ({"interval": True}, TypeError, "interval"),
        ({"after": -1}, ValueError, "after"),
        ({"after": "1"}, TypeError, "after"),
        ({"after": float("nan")}, ValueError, "after"),
        ({"action": "kill"}, ValueError, "action"),
        ({"action": None}, TypeError, "action"),
        ({"only": 1}, TypeError, "only"),
        ({"using": "nope"}, ValueError, "using"),
        ({"using": 1}, TypeError, "using"),
    ]
    for kwargs, error, name in cases:
        with pytest.raises(error, match=name), lockkit.prioritize(**kwargs):
            pytest.fail(f"prioritize({kwargs}) must be refused")
    with pytest.raises(NotSupportedError, match="PostgreSQL only"), lockkit.prioritize("sqlite"):
        pytest.fail("refused on SQLite")
    assert connections["sqlite"].connection is None
    assert not [t for t in threading.enumerate() if t.name.startswith("lockkit-prioritize")]
