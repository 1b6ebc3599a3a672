"""SQLite: a scope takes the database write lock at BEGIN (``BEGIN IMMEDIATE``); "database is locked" is a
``LockTimeout`` that ``locked_operation`` retries. On a real file database, with real threads."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import NotSupportedError, connections, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.errorcodes.translate import translating
from lockkit.testing import backend_pid, blocked_by, hold_lock, run_concurrently
from lockkit_tests.models import Item

ALIAS = "sqlite"
JOIN = 60.0

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", ALIAS])


def busy_timeout() -> int:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def write_locked() -> Iterator[None]:
    """Hold the database write lock from another connection (SQLite locks the whole database)."""
    other = sqlite3.connect(connections[ALIAS].settings_dict["NAME"], isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_four_threads_fifty_increments_each_end_at_exactly_200() -> None:
    counter = Item.objects.using(ALIAS).create(name="counter", value=0)
    retries: list[RetryEvent] = []
    policy = RetryPolicy(attempts=20, before_retry=retries.append)

    @lockkit.locked_operation(ALIAS, retry=policy, lock_timeout=5)
    def increment() -> None:
        item = lockkit.current_scope().get(Item, pk=counter.pk)  # read...
        item.value += 1  # ...decide...
        item.save(using=ALIAS, update_fields=["value"])  # ...write

    def worker() -> int:
        for _ in range(50):
            increment()
        return 50

    outcomes = run_concurrently(worker, 4, timeout=JOIN)
    errors = [o.error for o in outcomes if o.error is not None]
    assert errors == []  # no "database is locked" reached the caller
    assert [o.result for o in outcomes] == [50, 50, 50, 50]
    assert Item.objects.using(ALIAS).get(pk=counter.pk).value == 200
    # BEGIN IMMEDIATE made every scope wait its turn at BEGIN: not even a retried "database is locked".
    assert retries == []


def test_database_is_locked_is_a_lock_timeout_after_the_scope_lock_timeout() -> None:
    before = busy_timeout()
    with write_locked():
        started = time.monotonic()
        with pytest.raises(lockkit.LockTimeout) as caught, lockkit.locked(ALIAS, lock_timeout=0.3):
            pass  # the wait happens at BEGIN IMMEDIATE, when the scope begins
        elapsed = time.monotonic() - started
    assert "database is locked" in str(caught.value)
    assert caught.value.sqlstate == "5"  # SQLITE_BUSY
    assert caught.value.alias == ALIAS
    assert 0.25 <= elapsed < 3.0
    assert busy_timeout() == before  # the scope's busy timeout lasted for its BEGIN only
    assert not connections[ALIAS].in_atomic_block


def test_locked_operation_retries_database_is_locked_then_gives_up_with_lock_timeout() -> None:
    events: list[RetryEvent] = []

    @lockkit.locked_operation(
        ALIAS, lock_timeout=0.05, retry=RetryPolicy(attempts=2, before_retry=events.append)
    )
    def touch() -> None:
        Item.objects.using(ALIAS).update(value=F("value") + 1)

    with write_locked(), pytest.raises(lockkit.LockTimeout) as caught:
        touch()
    assert caught.value.attempts == 2
    assert [(e.failure, e.sqlstate) for e in events] == [(Failure.LOCK_TIMEOUT, "5")]


def test_scope_begins_with_begin_immediate_and_restores_transaction_mode() -> None:
    connection = connections[ALIAS]
    with CaptureQueriesContext(connection) as queries, lockkit.locked(ALIAS):
        Item.objects.using(ALIAS).count()
    assert any(q["sql"] == "BEGIN IMMEDIATE" for q in queries.captured_queries)
    assert connection.transaction_mode is None  # type: ignore[attr-defined]
    # A plain atomic() is untouched: still a deferred BEGIN.
    with CaptureQueriesContext(connection) as queries, transaction.atomic(using=ALIAS):
        Item.objects.using(ALIAS).count()
    assert queries.captured_queries[0]["sql"] == "BEGIN"


def test_nested_scope_runs_in_a_savepoint_and_its_failure_keeps_the_outer_work() -> None:
    with lockkit.locked(ALIAS):
        Item.objects.using(ALIAS).create(name="outer")
        with pytest.raises(ZeroDivisionError):
            nested_failure()
        with lockkit.locked(ALIAS) as inner:
            assert inner.nested
            Item.objects.using(ALIAS).create(name="inner")
    assert sorted(Item.objects.using(ALIAS).values_list("name", flat=True)) == ["inner", "outer"]


def nested_failure() -> None:
    with lockkit.locked(ALIAS):
        Item.objects.using(ALIAS).create(name="rolled back")
        raise ZeroDivisionError


@pytest.mark.parametrize("option", ["nowait", "skip_locked", "no_key"])
def test_row_lock_options_are_refused_before_any_sql(option: str) -> None:
    with CaptureQueriesContext(connections[ALIAS]) as queries, pytest.raises(NotSupportedError, match=option):
        lockkit.locked(ALIAS, **{option: True}).__enter__()  # type: ignore[call-overload]
    assert queries.captured_queries == []
    assert not connections[ALIAS].in_atomic_block


def test_statement_timeout_is_refused_before_any_sql() -> None:
    with (
        CaptureQueriesContext(connections[ALIAS]) as queries,
        pytest.raises(NotSupportedError, match="statement_timeout"),
    ):
        lockkit.locked(ALIAS, statement_timeout=1).__enter__()
    assert queries.captured_queries == []
    assert not connections[ALIAS].in_atomic_block


def test_shared_cache_table_lock_is_lock_not_available_with_the_reason() -> None:
    """Django's in-memory test database shares one cache: its table locks fail at once, never waited for."""
    from django.db.backends.sqlite3.base import DatabaseWrapper

    memory = {**connections[ALIAS].settings_dict, "NAME": "file:lockkit-shared?mode=memory&cache=shared"}
    holder, contender = (
        DatabaseWrapper(dict(memory), alias="memory"),
        DatabaseWrapper(dict(memory), alias="memory"),
    )
    try:
        with holder.cursor() as cursor:
            cursor.execute("CREATE TABLE t (x integer)")
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")
        started = time.monotonic()
        with pytest.raises(lockkit.LockNotAvailable) as caught, contender.cursor() as cursor:
            with translating("memory", nowait=False):
                cursor.execute("SELECT * FROM t")
        assert time.monotonic() - started < 1  # the 5 s busy timeout did not apply: nothing waited
    finally:
        holder.rollback()
        holder.close()
        contender.close()
    assert caught.value.sqlstate == "262"  # SQLITE_LOCKED_SHAREDCACHE
    assert "use a file database" in str(caught.value).lower()


def test_contention_helpers_refuse_sqlite_with_the_reason() -> None:
    item = Item.objects.using(ALIAS).create(name="i")
    for call in (
        lambda: backend_pid(ALIAS),
        lambda: blocked_by(1, using=ALIAS),
        lambda: hold_lock(item).__enter__(),
    ):
        with pytest.raises(NotImplementedError, match="SQLite has no row locks and no server sessions"):
            call()
