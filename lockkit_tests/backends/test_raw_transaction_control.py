"""A body that ends the scope's transaction with its own statement never leaves a timeout on the connection.

``cursor.execute("BEGIN")`` (or ``COMMIT``, ``ROLLBACK``, ``START TRANSACTION``, ``SET autocommit``) inside a scope
ends the transaction or savepoint behind Django's back; MariaDB keeps ``SET SESSION`` values across it, and the
savepoint the scope would restore them around is gone. Whatever the body does, once the scope and the transaction
around it have ended the session's timeouts are the server's defaults and the next scope on the connection works.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connections, transaction

import lockkit
from lockkit_tests.models import Owner, Stock
from lockkit_tests.support.vendors import vendor_params

STATEMENTS = {
    "postgresql": ["BEGIN", "COMMIT", "ROLLBACK", "START TRANSACTION", "SET autocommit = on"],
    "mysql": ["BEGIN", "COMMIT", "ROLLBACK", "START TRANSACTION", "SET autocommit = 1", "SET autocommit = 0"],
}
# Statements that leave an open transaction and its savepoints alone (PostgreSQL only warns about BEGIN there).
NO_OP_INSIDE_A_TRANSACTION = {
    "postgresql": {"BEGIN", "START TRANSACTION"},
    "mysql": {"SET autocommit = 0"},
}
OUTER = ["outermost", "nested in atomic", "nested in locked"]


def session_timeouts(alias: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """(lock timeout, statement timeout), each as (the session's value, what a fresh session starts with)."""
    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "postgresql":
            cursor.execute(
                "SELECT setting, reset_val FROM pg_settings WHERE name IN ('lock_timeout', 'statement_timeout') "
                "ORDER BY name"
            )
            rows = cursor.fetchall()
        else:
            cursor.execute(
                "SELECT @@SESSION.innodb_lock_wait_timeout, @@GLOBAL.innodb_lock_wait_timeout, "
                "@@SESSION.max_statement_time, @@GLOBAL.max_statement_time"
            )
            row = cursor.fetchone()
            assert row is not None
            rows = [row[:2], row[2:]]
    (lock, lock_default), (statement, statement_default) = ((str(a), str(b)) for a, b in rows)
    return (lock, lock_default), (statement, statement_default)


def defaults(alias: str) -> tuple[tuple[str, str], tuple[str, str]]:
    (_, lock), (_, statement) = session_timeouts(alias)
    return (lock, lock), (statement, statement)


def scope_timeout(alias: str) -> str:
    return session_timeouts(alias)[0][0]


@contextlib.contextmanager
def around(outer: str, alias: str) -> Iterator[None]:
    if outer == "outermost":
        yield
    elif outer == "nested in atomic":
        with transaction.atomic(using=alias):
            yield
    else:
        with lockkit.locked(alias, lock_timeout=3):
            yield


def cases() -> list[Any]:
    params = []
    for vendor in vendor_params():
        statements = STATEMENTS["postgresql" if vendor.id == "postgresql" else "mysql"]
        for statement in statements:
            for outer in OUTER:
                for fails in (True, False):
                    params.append(
                        pytest.param(
                            vendor.values[0],
                            statement,
                            outer,
                            fails,
                            id=f"{vendor.id}-{statement}-{outer}-{'fails' if fails else 'succeeds'}",
                            marks=vendor.marks,
                        )
                    )
    return params


@pytest.mark.parametrize("position", ["first", "after a locked read"])
@pytest.mark.parametrize(("alias", "statement", "outer", "fails"), cases())
def test_raw_transaction_control_in_a_scope_leaves_no_timeout_behind(
    alias: str, statement: str, outer: str, fails: bool, position: str
) -> None:
    connection = connections[alias]
    Stock.objects.using(alias).create(sku="widget", available=1)
    expected = defaults(alias)
    assert session_timeouts(alias) == expected
    raised: BaseException | None = None
    in_outer: list[str] = []
    try:
        with around(outer, alias):
            try:
                with lockkit.locked(alias, lock_timeout=1, statement_timeout=2) as scope:
                    if position != "first":
                        scope.get(Stock, pk="widget")
                    with connection.cursor() as cursor:
                        cursor.execute(statement)  # ends the scope's transaction (or savepoint) behind Django
                        cursor.execute("SELECT 1")
                    if fails:
                        raise ZeroDivisionError
            finally:
                if outer == "nested in locked" and not connection.needs_rollback:
                    in_outer.append(scope_timeout(alias))
    except (ZeroDivisionError, DatabaseError) as exc:
        raised = exc
    if fails:
        assert raised is not None
    elif outer != "outermost" and statement not in NO_OP_INSIDE_A_TRANSACTION[connection.vendor]:
        # The savepoint is gone: a nested scope that ended "successfully" says so rather than report success.
        assert isinstance(raised, DatabaseError), raised
        assert "does not exist" in str(raised) or "autocommit" in statement  # PostgreSQL has no such setting
    # The enclosing scope, where it could go on, had its own value back once the inner one ended.
    assert in_outer in ([], ["3"], ["3000"])
    assert not connection.in_atomic_block
    assert session_timeouts(alias) == expected
    # The next scope on the same connection sets its own timeout, and puts the default back.
    with lockkit.locked(alias, lock_timeout=4) as scope:
        assert scope_timeout(alias) in {"4", "4000"}  # seconds (MariaDB), milliseconds (PostgreSQL)
        assert scope.get(Stock, pk="widget").available == 1
    assert session_timeouts(alias) == expected


@pytest.mark.parametrize("alias", vendor_params())
def test_work_before_a_raw_commit_stays_committed_although_the_scope_failed(alias: str) -> None:
    """What docs/usage.md warns about: a raw COMMIT ends the scope's transaction there and then."""
    connection = connections[alias]
    with pytest.raises(ZeroDivisionError), lockkit.locked(alias, lock_timeout=1):
        Owner.objects.using(alias).create(name="before")
        with connection.cursor() as cursor:
            cursor.execute("COMMIT")
        Owner.objects.using(alias).create(name="after")
        raise ZeroDivisionError
    assert list(Owner.objects.using(alias).values_list("name", flat=True)) == ["before"]
    assert session_timeouts(alias) == defaults(alias)


@pytest.mark.parametrize("alias", [p for p in vendor_params() if p.id == "mariadb"])
def test_after_a_raw_set_autocommit_the_body_commits_statement_by_statement(alias: str) -> None:
    connection = connections[alias]
    with pytest.raises(ZeroDivisionError), lockkit.locked(alias, lock_timeout=1):
        with connection.cursor() as cursor:
            cursor.execute("SET autocommit = 1")
        Owner.objects.using(alias).create(name="after")
        raise ZeroDivisionError
    assert list(Owner.objects.using(alias).values_list("name", flat=True)) == ["after"]
    assert session_timeouts(alias) == defaults(alias)
    with lockkit.locked(alias, lock_timeout=1):  # Django turned autocommit off again for the next scope
        Owner.objects.using(alias).create(name="rolled back")
        transaction.set_rollback(True, using=alias)
    assert list(Owner.objects.using(alias).values_list("name", flat=True)) == ["after"]
