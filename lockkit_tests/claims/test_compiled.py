"""Claims keep Django's compilations for identical input: the SET clause of identical assignments, the locking
SELECT of one queryset object; every call still sends its own values as parameters."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection
from django.db.models import F, TextChoices, Value

from lockkit.claims import claim_next, complete, heartbeat, release
from lockkit.claims.sql import claims_sql_for
from lockkit.claims.sql.postgresql import PostgreSQLClaimsSQL
from lockkit_tests.models import Job

pytestmark = [pytest.mark.django_db(transaction=True)]


def _make(n: int) -> list[Job]:
    return Job.objects.bulk_create([Job(name=f"job-{i}") for i in range(n)])


@contextmanager
def counting(target: Any, name: str) -> Iterator[list[int]]:
    calls = [0]
    original = getattr(target, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    setattr(target, name, counted)
    try:
        yield calls
    finally:
        setattr(target, name, original)


@contextmanager
def statements() -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield seen


def test_each_claim_sends_its_own_values_as_parameters() -> None:
    _make(4)
    pending = Job.objects.filter(state="pending")
    with statements() as seen:
        first = claim_next(pending, worker="w-1", lease=30, set={"state": "running", "result": "a"})
        second = claim_next(pending, worker="w-2", lease=90, set={"state": "running", "result": "b"})
    rows = {j.pk: j for j in Job.objects.all()}
    (one,), (two,) = first, second
    assert (rows[one.pk].claimed_by, rows[one.pk].result) == ("w-1", "a")
    assert (rows[two.pk].claimed_by, rows[two.pk].result) == ("w-2", "b")
    expires, claimed_at = rows[two.pk].lease_expires_at, rows[two.pk].claimed_at
    assert expires is not None
    assert claimed_at is not None
    assert round((expires - claimed_at).total_seconds()) == 90
    assert (rows[one.pk].claim_token, rows[one.pk].attempts) == (1, 1)
    # Every value is a parameter: the worker names and results travel in params, never in the SQL text.
    claiming = [
        (sql, params) for sql, params in seen if "UPDATE" in sql
    ]  # not the transaction's own statements
    for (sql, params), worker, result in zip(claiming, ("w-1", "w-2"), ("a", "b"), strict=True):
        assert worker not in sql
        assert f"'{result}'" not in sql
        assert worker in params
        assert result in params


def test_the_set_clause_is_kept_for_identical_assignments_only() -> None:
    statements_ = claims_sql_for(Job, "default")
    sql, params = statements_.update({"state": "done", "result": "r"})
    again, again_params = statements_.update({"state": "done", "result": "r"})
    assert again is sql  # Django's own text, kept
    assert again_params == params == ["done", "r"]
    again_params.append("x")  # the caller's list is its own
    assert statements_.update({"state": "done", "result": "r"})[1] == ["done", "r"]
    # Equal but not identical input is compiled again, by Django: 1 and True prepare to other parameters.
    assert statements_.update({"result": 1})[1] == ["1"]
    assert statements_.update({"result": True})[1] == ["True"]
    other, other_params = statements_.update({"state": "done", "result": "s"})
    assert (other, other_params) == (sql, ["done", "s"])
    assert other is not sql
    expression = F("name")
    kept = statements_.update({"result": expression})[0]
    assert statements_.update({"result": expression})[0] is kept  # the very same expression object
    assert statements_.update({"result": F("name")})[0] is not kept  # another object: compiled per call


def test_shapes_are_told_apart() -> None:
    jobs = _make(3)
    pending = Job.objects.filter(state="pending")
    (a,) = claim_next(pending, worker="w", lease=30, set={"result": "x"})
    (b,) = claim_next(pending, worker="w", lease=30, set={"state": "running"})  # other field: another shape
    (c,) = claim_next(
        pending, worker="w", lease=30, set={"result": F("name")}
    )  # an expression: its own shape
    rows = {j.pk: j for j in Job.objects.all()}
    assert (rows[a.pk].result, rows[a.pk].state) == ("x", "pending")
    assert (rows[b.pk].result, rows[b.pk].state) == ("", "running")
    assert rows[c.pk].result == rows[c.pk].name
    assert {a.pk, b.pk, c.pk} == {j.pk for j in jobs}


def test_completion_heartbeat_and_release_write_their_own_values() -> None:
    _make(4)
    pending = Job.objects.filter(state="pending")
    claims = [claim_next(pending, worker="w", lease=30)[0] for _ in range(4)]
    complete(claims[0], set={"state": "done", "result": "r0"})
    complete(claims[1], set={"state": "done", "result": "r1"})
    renewed = heartbeat(claims[2], lease=120)
    heartbeat(claims[3], lease=60)
    release(claims[3], set={"state": "pending"})
    rows = {j.pk: j for j in Job.objects.all()}
    assert (rows[claims[0].pk].state, rows[claims[0].pk].result) == ("done", "r0")
    assert (rows[claims[1].pk].state, rows[claims[1].pk].result, rows[claims[1].pk].lease_expires_at) == (
        "done",
        "r1",
        None,
    )
    assert rows[claims[2].pk].lease_expires_at == renewed.lease_expires_at
    assert (rows[claims[3].pk].state, rows[claims[3].pk].lease_expires_at) == ("pending", None)


def test_the_locking_select_is_compiled_once_per_queryset_object() -> None:
    _make(6)
    pending = Job.objects.filter(state="pending")
    with counting(PostgreSQLClaimsSQL, "select_pks") as compiles:
        claim_next(pending, worker="w", lease=30)
        claim_next(pending, worker="w", lease=30)
        assert compiles == [1]
        claim_next(pending, worker="w", lease=30, limit=2)  # another limit
        claim_next(pending, worker="w", lease=30, order_by=["-pk"])  # another ordering
        assert compiles == [3]
        claim_next(Job.objects.filter(state="pending"), worker="w", lease=30)  # a new queryset object
        assert compiles == [4]
    assert Job.objects.filter(lease_expires_at__isnull=False).count() == 6


def test_a_cached_select_still_sees_new_rows_and_values_of_its_queryset() -> None:
    pending = Job.objects.filter(state="pending")
    assert claim_next(pending, worker="w", lease=30) == []
    (job,) = _make(1)
    (taken,) = claim_next(pending, worker="w", lease=30)
    assert taken.pk == job.pk
    assert claim_next(Job.objects.filter(state=Value("other")), worker="w", lease=30) == []


def test_a_choices_member_is_written_as_its_value() -> None:
    from django.db import models

    class State(models.TextChoices):
        RUNNING = "running"
        DONE = "done"

    _make(3)
    pending = Job.objects.filter(state="pending")
    first = claim_next(pending, worker="w-1", lease=30, set={"state": State.RUNNING})
    claim_next(pending, worker="w-2", lease=30, set={"state": State.RUNNING})
    complete(first[0], set={"state": State.DONE})
    (third,) = claim_next(pending, worker="w-3", lease=30, set={"state": State.RUNNING})
    complete(third, set={"state": State.DONE})
    assert sorted(Job.objects.values_list("state", flat=True)) == ["done", "done", "running"]


class _State(TextChoices):
    DONE = "done"
    PENDING = "pending"


def test_choices_members_are_kept_by_their_type_and_value() -> None:
    statements_ = claims_sql_for(Job, "default")
    sql, params = statements_.update({"state": _State.DONE, "result": "r"})
    again, again_params = statements_.update({"state": _State.DONE, "result": "r"})
    assert again is sql
    assert again_params == params == ["done", "r"]
    # Another member, or the member's plain value (another type), is compiled again by Django.
    other, other_params = statements_.update({"state": _State.PENDING, "result": "r"})
    assert other is not sql
    assert other_params == ["pending", "r"]
    plain = statements_.update({"state": "done", "result": "r"})[0]
    assert plain is not sql
    assert plain == sql


def test_identical_set_values_are_checked_again_when_they_change() -> None:
    """``set=`` is checked once per identical assignments, never reused for another value or a mutated dict."""
    (job,) = _make(1)
    pending = Job.objects.filter(state="pending")
    values: dict[str, Any] = {"result": "first"}
    (one,) = claim_next(pending, worker="w", lease=30, set=values)
    release(one)
    values["result"] = "second"  # the same dict object, another value: written as it is now
    (two,) = claim_next(pending, worker="w", lease=30, set=values)
    job.refresh_from_db()
    assert job.result == "second"
    release(two)
    unknown = F("no_such_field")
    for _ in range(2):  # a refused expression is refused on every call, never kept
        with pytest.raises(ValueError, match="no_such_field"):
            claim_next(pending, worker="w", lease=30, set={"result": unknown})
    values["state"] = object()  # not storable: refused before any SQL, though the rest was checked before
    with pytest.raises((TypeError, ValueError), match="state"):
        claim_next(pending, worker="w", lease=30, set=values)
    job.refresh_from_db()
    # Released, never claimed again by the refused calls.
    assert (job.lease_expires_at, job.claim_token, job.result) == (None, 2, "second")
