"""``set=`` expressions: each call's expression is compiled by Django and writes that call's values."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import Case, CharField, F, Q, Value, When
from django.db.models.functions import Concat, Lower, Now, Upper

from lockkit.claims import claim_next, complete, release
from lockkit_tests.models import Job
from lockkit_tests.support.claims_vendors import claims_vendor_params

VENDORS = claims_vendor_params()


def _claims(alias: str, n: int) -> list[Any]:
    Job.objects.using(alias).bulk_create([Job(name=f"Job-{i}") for i in range(n)])
    return claim_next(Job.objects.using(alias), worker="w", lease=30, limit=n)


def _result(alias: str, pk: Any) -> str:
    return str(Job.objects.using(alias).values_list("result", flat=True).get(pk=pk))


def _tagged(prefix: str, suffix: str) -> Any:
    return Concat(Value(prefix), Lower("name"), Value(suffix), output_field=CharField())


@pytest.mark.parametrize("alias", VENDORS)
def test_completions_with_expressions_bind_each_calls_values(alias: str) -> None:
    claims = _claims(alias, 4)
    complete(claims[0], set={"state": "done", "result": _tagged("a<", ">a")})
    complete(claims[1], set={"state": "done", "result": _tagged("b<", ">b")})
    complete(claims[2], set={"state": "done", "result": _tagged("", "")})
    assert [_result(alias, c.pk) for c in claims[:3]] == ["a<job-0>a", "b<job-1>b", "job-2"]
    complete(claims[3], set={"state": "done", "result": Upper("name")})
    assert _result(alias, claims[3].pk) == "JOB-3"


@pytest.mark.parametrize("alias", VENDORS)
def test_case_when_with_constant_conditions_and_value_leaves(alias: str) -> None:
    claims = _claims(alias, 4)

    def outcome(failed: str, other: str) -> Any:
        return Case(
            When(Q(name="Job-0") | Q(name__endswith="-2"), then=Value(failed)),
            default=Concat(Value(other), F("name")),
            output_field=CharField(),
        )

    release(claims[0], set={"result": outcome("x0", "y0")})
    release(claims[1], set={"result": outcome("x1", "y1")})
    release(claims[2], set={"result": outcome("x2", "y2")})
    assert [_result(alias, c.pk) for c in claims[:3]] == ["x0", "y1Job-1", "x2"]
    complete(claims[3], set={"result": Case(When(name="Job-3", then=Value("z")), default=Value("no"))})
    assert _result(alias, claims[3].pk) == "z"


@pytest.mark.parametrize("alias", VENDORS)
def test_a_new_now_per_call_writes_the_clock(alias: str) -> None:
    claims = _claims(alias, 3)
    complete(
        claims[0], set={"state": "done", "result": Concat(Value("at "), Now(), output_field=CharField())}
    )
    complete(
        claims[1], set={"state": "done", "result": Concat(Value("on "), Now(), output_field=CharField())}
    )
    assert _result(alias, claims[0].pk).startswith("at 20")
    assert _result(alias, claims[1].pk).startswith("on 20")


@pytest.mark.django_db(transaction=True)
def test_leaves_are_bound_in_their_own_order() -> None:
    claims = _claims("default", 4)
    complete(claims[0], set={"result": Concat(Value("s"), Value("s"), output_field=CharField())})
    complete(claims[1], set={"result": Concat(Value("p"), Value("q"), output_field=CharField())})
    complete(claims[2], set={"result": Concat(Value("q"), Value("p"), output_field=CharField())})
    complete(claims[3], set={"result": Concat(Value("m"), Value("m"), output_field=CharField())})
    assert [_result("default", c.pk) for c in claims] == ["ss", "pq", "qp", "mm"]


@pytest.mark.django_db(transaction=True)
def test_values_stay_parameters() -> None:
    from django.db import connection

    (claim,) = _claims("default", 1)
    seen: list[tuple[str, Any]] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((sql, params))
        return execute(sql, params, many, context)

    complete(claim, set={"result": _tagged("warm<", ">")})
    (again,) = claim_next(Job.objects.filter(pk=claim.pk), worker="w", lease=30)  # the completed job, again
    with connection.execute_wrapper(wrapper):
        complete(again, set={"result": _tagged("secret'<", ">tail")})
    (update,) = [(sql, params) for sql, params in seen if "UPDATE" in sql]
    assert "secret" not in update[0]
    assert "tail" not in update[0]
    assert "secret'<" in update[1]
    assert _result("default", claim.pk) == "secret'<job-0>tail"


@pytest.mark.parametrize("alias", VENDORS)
def test_json_documents_are_bound_per_call(alias: str) -> None:
    from sample_project.jobs.models import Job as SampleJob

    SampleJob.objects.using(alias).bulk_create([SampleJob(name=f"s{i}") for i in range(3)])
    claims = claim_next(SampleJob.objects.using(alias), worker="w", lease=30, limit=3)
    complete(claims[0], set={"state": "done", "result": {"ok": 0}})
    complete(claims[1], set={"state": "done", "result": {"ok": 1, "quote": "it's"}})
    complete(claims[2], set={"state": "failed", "result": ["a", {"b": None}]})
    results = dict(SampleJob.objects.using(alias).values_list("pk", "result"))
    assert [results[c.pk] for c in claims] == [{"ok": 0}, {"ok": 1, "quote": "it's"}, ["a", {"b": None}]]


@pytest.mark.parametrize("alias", VENDORS)
def test_an_accepted_shape_does_not_let_a_bad_expression_of_another_through(alias: str) -> None:
    """Every ``set=`` expression is checked, also after one of the same structure was accepted."""
    from django.db.models import Count

    held = _claims(alias, 2)
    complete(held[0], set={"result": Concat(F("name"), Value("-done"), output_field=CharField())})
    assert _result(alias, held[0].pk) == "Job-0-done"
    with pytest.raises(ValueError, match="no_such_field"):
        complete(
            held[1], set={"result": Concat(F("no_such_field"), Value("-done"), output_field=CharField())}
        )
    with pytest.raises(ValueError, match="aggregates or window functions"):
        complete(held[1], set={"result": Count("name")})
    # Nothing was written: the claim is still held and the row still claimable by its token.
    row = Job.objects.using(alias).get(pk=held[1].pk)
    assert (row.claim_token, row.result) == (held[1].token, "")
    complete(held[1], set={"result": Concat(F("name"), Value("-also"), output_field=CharField())})
    assert _result(alias, held[1].pk) == "Job-1-also"
