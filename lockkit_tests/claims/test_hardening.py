"""Hardening of ``lockkit.claims`` (issue 17): each test reproduces a defect found on main before its fix.

Fences compare primary keys exactly as the column stores them and check the worker; forged or travelled claims,
hostile ``set=``/``order_by=``/``when=`` values and ``select_for_update()`` querysets are refused before any SQL;
schema-qualified tables and dotted column names work for every claims call and for ``LockScope.lock()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.db.models import F, Q
from django.db.models.functions import Lower

import lockkit
from lockkit.claims import (
    Claim,
    StaleClaim,
    claim,
    claim_next,
    complete,
    complete_many,
    heartbeat,
    heartbeat_held,
    reclaim_expired,
    release,
    release_many,
)
from lockkit.claims.sql import claims_sql_for
from lockkit.testing import assert_single_alias
from lockkit_tests.models import QUEUE_SCHEMA, CodeJob, DottedJob, Job, NotClaimable, PricedJob, QueuedJob

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])

# Every single-claim call a worker makes after claiming.
FENCED: list[Callable[[Claim], Any]] = [
    heartbeat,
    lambda c: complete(c, set={"state": "done"}),
    lambda c: release(c, set={"state": "pending"}),
    lambda c: complete_many([c]),
    lambda c: release_many([c]),
]
FENCED_IDS = ["heartbeat", "complete", "release", "complete_many", "release_many"]


@contextmanager
def no_sql() -> Iterator[None]:
    """Fail unless the block sends no statement at all, on any alias."""
    with assert_single_alias("default") as log:
        yield
    assert log.queries == []


def _claimed(model: type[Any], **fields: Any) -> tuple[Any, Claim]:
    row = model.objects.create(**fields)
    found = claim(row, worker="w", lease=60)
    assert found is not None
    return row, found


def _expire(model: type[Any], *pks: Any) -> None:
    """Move the leases of ``pks`` an hour into the past, as if they had run out."""
    model.objects.filter(pk__in=pks).update(lease_expires_at=F("lease_expires_at") - timedelta(hours=1))


def _still_claimed(row: Any, held: Claim) -> None:
    """The row still carries ``held`` exactly: nothing was written."""
    row.refresh_from_db()
    assert row.claim_token == held.token
    assert row.lease_expires_at == held.lease_expires_at
    assert row.claimed_by == held.worker


# -- 1. fences compare each pk exactly as the column stores it ---------------------------------------------------


@pytest.mark.parametrize("call", FENCED, ids=FENCED_IDS)
def test_a_pk_the_char_column_would_truncate_is_refused_before_sql(call: Callable[[Claim], Any]) -> None:
    # On main, 'AAAAAAAAAAAAZZZ' was cast to varchar(12) and renewed/completed the row 'AAAAAAAAAAAA'.
    row, held = _claimed(CodeJob, code="A" * 12)
    with no_sql(), pytest.raises(ValueError, match=r"claim.*pk"):
        call(replace(held, pk="A" * 12 + "ZZZ"))
    _still_claimed(row, held)


def test_a_decimal_the_column_would_round_is_refused_and_nothing_is_written() -> None:
    # On main: the batch wrote and committed row 1.00, then raised StaleClaim("... nothing was written").
    row, held = _claimed(PricedJob, price=Decimal("1.00"))
    twin = replace(held, pk=Decimal("1.001"))
    with no_sql(), pytest.raises(ValueError, match=r"pk"):
        release_many([held, twin], set={})
    _still_claimed(row, held)


def test_a_decimal_pk_is_compared_exactly_and_batches_stay_all_or_nothing() -> None:
    one, first = _claimed(PricedJob, price=Decimal("1.00"))
    _, second = _claimed(PricedJob, price=Decimal("2.50"))
    release_many([first, second])
    with pytest.raises(StaleClaim) as raised:
        complete_many([first, second])  # both released already: stale
    assert {c.pk for c in raised.value.claims} == {Decimal("1.00"), Decimal("2.50")}
    third = claim(one, worker="w", lease=60)
    assert third is not None
    with pytest.raises(StaleClaim) as raised:
        complete_many([third, second])  # second is stale: third must not be written either
    assert [c.pk for c in raised.value.claims] == [Decimal("2.50")]
    _still_claimed(one, third)
    heartbeat(replace(third, pk="1.0"))  # the same row as the field reads it: renewed


def test_the_batch_statement_writes_nothing_when_the_database_sees_one_row_twice() -> None:
    # Defence in depth below the Python checks: two keys the database compares as one row (1.00 and 1.0) are
    # "two live claims" to a count(*), so the statement requires as many distinct live rows as claims.
    row, held = _claimed(PricedJob, price=Decimal("1.00"))
    statements = claims_sql_for(PricedJob, "default")
    rows = statements.fenced_update(
        [Decimal("1.00"), Decimal("1.0")], [held.token] * 2, [held.worker] * 2, {"lease_expires_at": None}
    )
    assert rows
    assert not any(r["written"] for r in rows)
    _still_claimed(row, held)


def test_a_float_pk_the_integer_field_would_truncate_is_refused() -> None:
    # On main, pk=1.5 was read as 1 by IntegerField.to_python and completed row 1.
    row, held = _claimed(Job, name="a")
    with no_sql(), pytest.raises(ValueError, match=r"pk"):
        complete(replace(held, pk=row.pk + 0.5), set={"state": "done"})
    _still_claimed(row, held)


@pytest.mark.parametrize(
    "pk",
    [2**63, -(2**63) - 1, float("inf"), float("-inf"), float("nan"), "1\x00", "\ud800", True, b"1"],
    ids=["2**63", "-2**63-1", "inf", "-inf", "nan", "NUL", "surrogate", "bool", "bytes"],
)
@pytest.mark.parametrize("call", FENCED, ids=FENCED_IDS)
def test_a_pk_out_of_the_fields_range_is_refused_before_sql(call: Callable[[Claim], Any], pk: Any) -> None:
    # On main: 2**63 failed in the database (DataError 22003), inf escaped as OverflowError, a surrogate as
    # UnicodeEncodeError.
    row, held = _claimed(Job, name="a")
    with no_sql(), pytest.raises((ValueError, TypeError), match=r"claim.*pk"):
        call(replace(held, pk=pk))
    _still_claimed(row, held)


# -- 2. Claim values validated completely before SQL -------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("token", 2**63, ValueError),
        ("token", 1.0, ValueError),
        ("lease", float("inf"), ValueError),
        ("lease", "60", TypeError),
        ("alias", "nowhere", ValueError),
        ("alias", 3, TypeError),
        ("model", NotClaimable, TypeError),
        ("model", "Job", TypeError),
        ("worker", 7, TypeError),
        ("worker", "\ud800", ValueError),
        ("worker", "", ValueError),
        ("attempt", -1, ValueError),
        ("attempt", "1", TypeError),
    ],
)
@pytest.mark.parametrize("call", FENCED, ids=FENCED_IDS)
def test_every_value_of_a_forged_claim_is_checked_before_sql(
    call: Callable[[Claim], Any], field: str, value: Any, error: type[Exception]
) -> None:
    row, held = _claimed(Job, name="a")
    with no_sql(), pytest.raises(error, match=rf"claim.*\b{field}\b"):
        call(replace(held, **{field: value}))
    _still_claimed(row, held)


# -- 3. querysets that already carry select_for_update() ---------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda qs: claim_next(qs, worker="w", lease=60),
        lambda qs: claim(qs.filter(name="a"), worker="w", lease=60),
        lambda qs: reclaim_expired(qs),
    ],
    ids=["claim_next", "claim", "reclaim_expired"],
)
@pytest.mark.parametrize(
    "locking",
    [{}, {"nowait": True}, {"skip_locked": True}, {"of": ("self",)}],
    ids=["plain", "nowait", "skip_locked", "of"],
)
@pytest.mark.parametrize("in_atomic", [False, True], ids=["autocommit", "atomic"])
def test_a_queryset_with_select_for_update_is_refused_before_sql(
    call: Callable[[Any], Any], locking: dict[str, Any], in_atomic: bool
) -> None:
    # On main: outside a transaction Django's TransactionManagementError; inside one, the strongest clause won
    # (FOR UPDATE over FOR NO KEY UPDATE, NOWAIT over SKIP LOCKED).
    job = Job.objects.create(name="a")
    with transaction.atomic() if in_atomic else _nothing(), no_sql():
        with pytest.raises(ValueError, match="select_for_update"):
            call(Job.objects.select_for_update(**locking))
    job.refresh_from_db()
    assert job.lease_expires_at is None


@contextmanager
def _nothing() -> Iterator[None]:
    yield


# -- 4. identifiers from model metadata: schema-qualified tables, dotted columns ---------------------------------


@pytest.fixture
def queue_schema() -> Iterator[None]:
    """Make ``QueuedJob``'s schema and table in the default test database; drop both after the test."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(QUEUE_SCHEMA)}")
    with connection.schema_editor() as editor:
        editor.create_model(QueuedJob)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP SCHEMA {quote(QUEUE_SCHEMA)} CASCADE")


@pytest.mark.usefixtures("queue_schema")
def test_every_claims_call_works_on_a_schema_qualified_table() -> None:
    # On main: "FOR UPDATE must specify unqualified relation names" from every call.
    first, second, third = (QueuedJob.objects.create(state="pending") for _ in range(3))
    found = claim(first, worker="w", lease=60, set={"state": "running"})
    assert found is not None
    batch = claim_next(QueuedJob.objects.filter(state="pending"), worker="w", lease=60, limit=5)
    assert [c.pk for c in batch] == [second.pk, third.pk]
    renewed = heartbeat(found, lease=120)
    assert renewed.lease_expires_at > found.lease_expires_at
    complete(renewed, set={"state": "done"})
    release(batch[0], set={"state": "pending"})
    again = claim_next(QueuedJob.objects.filter(state="pending"), worker="w2", lease=60)
    complete_many([*again, batch[1]], set={"state": "done"})
    expired = claim_next(QueuedJob.objects.filter(state="pending"), worker="w", lease=60)
    assert expired == []
    QueuedJob.objects.filter(pk=first.pk).update(state="pending", lease_expires_at=None)
    (late,) = claim_next(QueuedJob.objects.all(), worker="w", lease=60)
    _expire(QueuedJob, late.pk)
    assert reclaim_expired(QueuedJob.objects.all(), set={"state": "pending"}) == 1
    with pytest.raises(StaleClaim):
        release_many([late])
    states = dict(QueuedJob.objects.values_list("pk", "state"))
    assert states == {first.pk: "pending", second.pk: "done", third.pk: "done"}
    # expired=True (one row and many) and the worker-level heartbeat, on the qualified table too.
    (soon,) = claim_next(QueuedJob.objects.all(), worker="w", lease=60)
    _expire(QueuedJob, soon.pk)
    (taken,) = claim_next(QueuedJob.objects.all(), worker="w3", lease=60, expired=True)
    assert (taken.pk, taken.token) == (soon.pk, soon.token + 1)
    _expire(QueuedJob, taken.pk)
    many = claim_next(QueuedJob.objects.exclude(state="done"), worker="w3", lease=60, limit=2, expired=True)
    assert [c.pk for c in many] == [taken.pk]
    assert heartbeat_held(QueuedJob.objects.all(), worker="w3", lease=90) == {taken.pk: many[0].token}


@pytest.mark.usefixtures("queue_schema")
def test_scope_lock_names_a_schema_qualified_table_in_for_update_of() -> None:
    # On main: lock(), get() and lock_all() failed with "FOR UPDATE must specify unqualified relation names".
    job = QueuedJob.objects.create(state="pending")
    other = connections.create_connection("default")
    try:
        with lockkit.locked() as scope:
            assert scope.get(QueuedJob, pk=job.pk).pk == job.pk
            assert [j.pk for j in scope.lock_all(QueuedJob, [job.pk])] == [job.pk]
            assert list(
                scope.lock(QueuedJob.objects.filter(state="pending")).values_list("pk", flat=True)
            ) == [job.pk]
            # The lock is on the right relation: another session cannot take the row.
            with other.cursor() as cursor, pytest.raises(OperationalError) as raised:
                cursor.execute(
                    f'SELECT 1 FROM "{QUEUE_SCHEMA}"."queued_job" WHERE id = %s FOR UPDATE NOWAIT', [job.pk]
                )
            assert getattr(raised.value.__cause__, "sqlstate", None) == "55P03"
    finally:
        other.close()


@pytest.mark.parametrize("call", FENCED, ids=FENCED_IDS)
def test_a_dotted_pk_column_works_for_every_fenced_write(call: Callable[[Claim], Any]) -> None:
    # On main: the table name was recovered with rsplit(".") on '"..."."job.id"', which cut the column name.
    row, held = _claimed(DottedJob)
    call(held)
    row.refresh_from_db()
    assert row.claim_token == held.token
    with pytest.raises(StaleClaim):
        complete(replace(held, token=held.token + 1))


def test_dotted_pk_claim_next_and_reclaim() -> None:
    rows = [DottedJob.objects.create() for _ in range(3)]
    claimed = claim_next(DottedJob.objects.all(), worker="w", lease=60, limit=2)
    assert [c.pk for c in claimed] == [rows[0].pk, rows[1].pk]
    _expire(DottedJob, *(c.pk for c in claimed))
    assert reclaim_expired(DottedJob.objects.all(), set={"state": "again"}) == 2


# -- 6. bad input raises only documented exception types, before any SQL -----------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"worker": "\ud800"}, ValueError, "worker"),  # main: UnicodeEncodeError after a statement was sent
        ({"worker": "w", "order_by": ["nope"]}, ValueError, "order_by"),  # main: FieldError
        ({"worker": "w", "order_by": [F("nope").desc()]}, ValueError, "order_by"),  # main: AttributeError
        ({"worker": "w", "set": {"state": "x" * 21}}, ValueError, "state"),  # main: DataError after SQL
        ({"worker": "w", "set": {"state": "a\x00"}}, ValueError, "state"),  # main: DataError after SQL
        ({"worker": "w", "set": {"state": "\udfff"}}, ValueError, "state"),  # main: UnicodeEncodeError
        ({"worker": "w", "set": {"state": None}}, ValueError, "state"),  # main: IntegrityError after SQL
        ({"worker": "w", "set": {"name": F("nope")}}, ValueError, "set"),  # main: FieldError
    ],
)
def test_claim_next_refuses_hostile_values_with_documented_errors_before_sql(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    Job.objects.create(name="a")
    with no_sql(), pytest.raises(error, match=match):
        claim_next(Job.objects.all(), lease=60, **kwargs)
    assert Job.objects.filter(lease_expires_at__isnull=False).count() == 0


def test_claim_refuses_an_unknown_field_in_when_before_sql() -> None:
    job = Job.objects.create(name="a")
    with no_sql(), pytest.raises(ValueError, match="when"):
        claim(job, worker="w", lease=60, when=Q(nope=1))  # main: FieldError


def test_reclaim_refuses_hostile_set_values_before_sql() -> None:
    with no_sql():
        with pytest.raises(ValueError, match="state"):
            reclaim_expired(Job.objects.all(), set={"state": "x" * 21})
        with pytest.raises(ValueError, match="exhausted_set"):
            reclaim_expired(Job.objects.all(), max_attempts=3, exhausted_set={"state": "\x00"})


def test_complete_refuses_hostile_set_values_before_sql() -> None:
    row, held = _claimed(Job, name="a")
    with no_sql(), pytest.raises(ValueError, match="result"):
        complete(held, set={"result": "r" * 81})
    _still_claimed(row, held)


def test_ordering_expressions_are_honoured() -> None:
    # On main: AttributeError: 'F' object has no attribute 'contains_aggregate'.
    for name in ("b", "c", "a"):
        Job.objects.create(name=name)
    by_name = claim_next(Job.objects.all(), worker="w", lease=60, limit=3, order_by=[F("name").desc()])
    assert [Job.objects.get(pk=c.pk).name for c in by_name] == ["c", "b", "a"]
    Job.objects.update(lease_expires_at=None)
    lowered = claim_next(Job.objects.all(), worker="w", lease=60, limit=3, order_by=[Lower("name").asc()])
    assert [Job.objects.get(pk=c.pk).name for c in lowered] == ["a", "b", "c"]
    Job.objects.update(lease_expires_at=None)
    bare = claim_next(Job.objects.all(), worker="w", lease=60, limit=1, order_by=[F("name")])
    assert [Job.objects.get(pk=c.pk).name for c in bare] == ["a"]


# -- 7. fences check the worker ----------------------------------------------------------------------------------


@pytest.mark.parametrize("call", FENCED, ids=FENCED_IDS)
def test_another_workers_name_does_not_pass_the_fence(call: Callable[[Claim], Any]) -> None:
    # On main: the fence checked the token only, so worker "x" completed worker "w"'s claim.
    row, held = _claimed(Job, name="a")
    with pytest.raises(StaleClaim):
        call(replace(held, worker="x"))
    _still_claimed(row, held)
