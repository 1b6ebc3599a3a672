"""Hostile tests of the caches of commit 92938de: the kept SET compilation (``identical``), the kept ``set=`` checks
(``inputs._CHECKED``), the kept ``fetch=True`` converters, on real PostgreSQL and MariaDB.

Cached output must never differ from what an uncached call would produce for the same input. The three defects they
found (an unhashable or mutable enumeration member taken as identical input; MariaDB's date-time converters kept
across a change of ``USE_TZ``) are fixed: only choices members holding a plain value are keys, and the converters
are kept per ``USE_TZ``."""

from __future__ import annotations

import enum
import threading
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.db import connections
from django.db.models import CharField, DateTimeField, F, IntegerChoices, TextChoices, Value
from django.db.models.functions import Cast, Concat, ExtractHour
from django.utils import timezone

from lockkit.claims import claim_next, complete, release
from lockkit_tests.models import Job, PricedJob
from lockkit_tests.support.util import run_threads
from lockkit_tests.support.vendors import vendor_params

VENDORS = vendor_params()
PG = [pytest.param("default", id="postgresql", marks=pytest.mark.django_db(transaction=True))]
MARIADB = [p for p in VENDORS if p.id == "mariadb"]


# -- enumeration members ----------------------------------------------------------------------------------------


class Colour(TextChoices):
    RED = "red"


class Shade(TextChoices):
    RED = "red"  # the same value as Colour.RED, another class


class Level(IntegerChoices):
    ONE = 1


class Perm(enum.IntFlag):
    R = 1
    W = 2


class Plain(enum.Enum):
    RED = "red"


class Tags(list[str], enum.Enum):  # type: ignore[misc]  # a member that is a list: not hashable
    BOTH = ["a", "b"]


class Mutable(enum.Enum):
    """A member holding a list, written as its items (``str``): the member is the same, its value is not."""

    CODES = ["a"]

    def __str__(self) -> str:
        return ",".join(self.value)


def _one(alias: str, **fields: Any) -> Job:
    return Job.objects.using(alias).create(name="j", **fields)


def _claim_set(alias: str, values: dict[str, Any]) -> Job:
    """Claim the one pending job with ``set=values``; return the row as stored."""
    pending = Job.objects.using(alias).filter(state="pending")
    (claim,) = claim_next(pending, worker="w", lease=30, set=values)
    release(claim, set={"state": "pending"})
    return Job.objects.using(alias).get(pk=claim.pk)


@pytest.mark.parametrize("alias", VENDORS)
def test_members_of_different_types_with_equal_values_each_write_their_own_text(alias: str) -> None:
    _one(alias)
    stored = [
        _claim_set(alias, {"result": value}).result
        for value in (Colour.RED, Shade.RED, "red", Plain.RED, Level.ONE, 1, True, Perm.R, Perm.R | Perm.W, 3)
    ]
    # CharField writes str(value): Plain's str is "Plain.RED"; IntFlag's str is its int (3.11+); a bool is "True".
    assert stored == ["red", "red", "red", "Plain.RED", "1", "1", "True", "1", "3", "3"]
    # and again, now every one of them is kept
    again = [_claim_set(alias, {"result": v}).result for v in (True, 1, Plain.RED, Shade.RED)]
    assert again == ["True", "1", "Plain.RED", "red"]


@pytest.mark.parametrize("alias", VENDORS)
def test_an_unhashable_member_is_written_not_refused(alias: str) -> None:
    _one(alias)
    assert _claim_set(alias, {"result": Tags.BOTH}).result == "Tags.BOTH"


@pytest.mark.parametrize("alias", VENDORS)
def test_a_member_whose_value_changed_is_written_as_it_is_now(alias: str) -> None:
    _one(alias)
    Mutable.CODES.value[:] = ["a"]
    try:
        assert _claim_set(alias, {"result": Mutable.CODES}).result == "a"
        Mutable.CODES.value.append("b")
        assert _claim_set(alias, {"result": Mutable.CODES}).result == "a,b"
    finally:
        Mutable.CODES.value[:] = ["a"]


@pytest.mark.parametrize("alias", VENDORS)
def test_a_member_grown_too_long_is_refused_before_sql(alias: str) -> None:
    _one(alias)
    Mutable.CODES.value[:] = ["a"]
    pending = Job.objects.using(alias).filter(state="pending")
    try:
        (claim,) = claim_next(pending, worker="w", lease=30, set={"result": Mutable.CODES})
        release(claim, set={"state": "pending"})
        Mutable.CODES.value[:] = ["x" * 100]  # result is varchar(80)
        with pytest.raises(ValueError, match=r"set\['result'\] is 100 characters long"):
            claim_next(pending, worker="w", lease=30, set={"result": Mutable.CODES})
    finally:
        Mutable.CODES.value[:] = ["a"]


# -- a bad set= after a good identical one ------------------------------------------------------------------------


@pytest.mark.parametrize("alias", VENDORS)
def test_bad_set_raises_before_sql_every_time_even_after_good_ones(alias: str) -> None:
    _one(alias)
    pending = Job.objects.using(alias).filter(state="pending")
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    for _ in range(2):
        (claim,) = claim_next(pending, worker="w", lease=30, set={"state": "running", "result": "ok"})
        release(claim, set={"state": "pending"})
    bad: list[tuple[dict[Any, Any], type[Exception], str]] = [
        ({"state": "running", "result": "x" * 81}, ValueError, r"set\['result'\] is 81 characters long"),
        ({"state": "running", "nope": "ok"}, ValueError, r"set: Job has no field 'nope'"),
        ({"state": None}, ValueError, r"set\['state'\] is None but the column is NOT NULL"),
        ({"claimed_by": "x"}, ValueError, r"set: 'claimed_by' is a claim field"),
        ({1: "x"}, TypeError, r"set keys must be field names"),
        ({"state": "running", "result": "a\x00b"}, ValueError, r"set\['result'\]"),
    ]
    with connections[alias].execute_wrapper(wrapper):
        for _ in range(3):
            for values, error, message in bad:
                with pytest.raises(error, match=message):
                    claim_next(pending, worker="w", lease=30, set=values)
    assert seen == []
    assert list(Job.objects.using(alias).values_list("state", "result", "claim_token")) == [
        ("pending", "ok", 2)
    ]


# -- more than 64 shapes, threads with their own connections -------------------------------------------------------


@pytest.mark.parametrize("alias", VENDORS)
def test_eviction_under_threads_keeps_each_threads_values(alias: str) -> None:
    jobs = Job.objects.using(alias).bulk_create([Job(name=f"t{i}") for i in range(4)])
    errors: list[BaseException] = []
    written: dict[int, list[str]] = {}
    barrier = threading.Barrier(4, timeout=30)

    def run(index: int) -> None:
        try:
            mine = Job.objects.using(alias).filter(pk=jobs[index].pk)
            barrier.wait()
            for round_ in range(40):
                # 4 threads x 40 distinct shapes: the caches (64) are cleared many times meanwhile
                result = f"t{index}-{round_}"
                (claim,) = claim_next(
                    mine, worker=f"w{index}", lease=30, set={"result": result, "state": "r"}
                )
                complete(claim, set={"state": "pending", "name": f"n{index}-{round_ % 3}"})
                row = Job.objects.using(alias).get(pk=jobs[index].pk)
                written.setdefault(index, []).append(f"{row.result}/{row.name}/{row.state}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(run, 4)
    assert errors == []
    for index in range(4):
        assert written[index] == [f"t{index}-{r}/n{index}-{r % 3}/pending" for r in range(40)]


# -- expressions and the time zone -----------------------------------------------------------------------------


# PostgreSQL only: this MariaDB has no time zone tables (CONVERT_TZ gives NULL), and CI allows no skipped test.
@pytest.mark.parametrize("alias", PG)
def test_an_expression_reused_after_timezone_activate_follows_the_zone(alias: str) -> None:
    _one(alias)
    # a fixed instant, 12:00 UTC: its hour in the current time zone
    hour = ExtractHour(Value(datetime(2030, 1, 1, 12, 0, tzinfo=UTC), output_field=DateTimeField()))
    text = Concat(Value("h"), Cast(hour, CharField()))
    values = {"result": text}
    results = []
    for zone in ("UTC", "Asia/Tokyo", "America/New_York", "UTC"):
        with timezone.override(zone):
            results.append(_claim_set(alias, values).result)
    assert results == ["h12", "h21", "h7", "h12"]


@pytest.mark.parametrize("alias", VENDORS)
def test_the_same_f_expression_object_on_two_models_and_aliases(alias: str) -> None:
    _one(alias)
    both = F("name")
    assert _claim_set(alias, {"result": both}).result == "j"
    PricedJob.objects.using(alias).create(price=Decimal("1.50"))
    (claim,) = claim_next(PricedJob.objects.using(alias).all(), worker="w", lease=30, fetch=True)
    assert claim.instance.price == Decimal("1.50")
    with pytest.raises(ValueError, match="PricedJob has no field 'name'"):
        claim_next(PricedJob.objects.using(alias).all(), worker="w", lease=30, set={"name": both})


# -- settings the kept output depends on --------------------------------------------------------------------------
