"""SQLSTATE 40003 at COMMIT is CockroachDB's "result is ambiguous": ``CommitOutcomeUnknown``, never retried
(issue 23, distributed SQL). PostgreSQL raises the same code at COMMIT here from a deferred constraint trigger,
which fires when the transaction commits.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections

import lockkit
from lockkit import RetryEvent, RetryPolicy
from lockkit.backends.postgresql.backend import distributed_sql
from lockkit_tests.models import Item

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


@pytest.fixture
def ambiguous_at_commit() -> Iterator[None]:
    table = connections["default"].ops.quote_name(Item._meta.db_table)
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION lockkit_test_ambiguous() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'result is ambiguous' USING ERRCODE = '40003'; END $$"
        )
        cursor.execute(
            f"CREATE CONSTRAINT TRIGGER lockkit_test_ambiguous AFTER INSERT ON {table} "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION lockkit_test_ambiguous()"
        )
    yield
    with connections["default"].cursor() as cursor:
        cursor.execute(f"DROP TRIGGER lockkit_test_ambiguous ON {table}")
        cursor.execute("DROP FUNCTION lockkit_test_ambiguous()")


def test_40003_at_commit_is_commit_outcome_unknown_and_not_retried(ambiguous_at_commit: None) -> None:
    events: list[RetryEvent] = []
    callbacks: list[str] = []

    @lockkit.locked_operation(retry=RetryPolicy(before_retry=events.append))
    def record() -> None:
        Item.objects.create(name="ambiguous")
        lockkit.current_scope().on_commit(lambda: callbacks.append("sent"))

    with pytest.raises(lockkit.CommitOutcomeUnknown) as caught:
        record()
    assert caught.value.sqlstate == "40003"
    assert isinstance(caught.value.xid, int)
    assert (events, callbacks) == ([], [])
    with lockkit.locked():  # the next call works
        pass


def test_postgresql_is_not_taken_for_a_distributed_sql_database() -> None:
    connections["default"].ensure_connection()
    assert distributed_sql(connections["default"]) is None
