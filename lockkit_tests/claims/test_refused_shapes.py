"""Inputs the claims cannot honour are refused before any SQL with a ValueError/TypeError naming the parameter.

Each failed before its fix (issue 26, item 10): a model with a ``CompositePrimaryKey`` gave ``AssertionError``, an
aggregate in ``set=`` a ``FieldError``, and a window-function annotation reached the database
(``NotSupportedError``/``ProgrammingError`` after a statement was sent).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models import (
    Case,
    CharField,
    Count,
    F,
    Max,
    Min,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
    Window,
)
from django.db.models.functions import Coalesce, Rank, RowNumber
from django.db.models.lookups import Exact, GreaterThan
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from lockkit.claims import (
    Claim,
    claim,
    claim_next,
    complete,
    complete_many,
    fenced,
    heartbeat,
    held_by,
    reclaim_expired,
    release,
    release_many,
)
from lockkit_tests.models import Job, PairJob
from lockkit_tests.support.claims_vendors import claims_vendor_params

pytestmark = pytest.mark.parametrize("alias", claims_vendor_params())


@contextmanager
def no_sql(alias: str) -> Iterator[None]:
    """Fail unless the block sends no statement at all on ``alias`` (nor on ``default``)."""
    with ExitStack() as stack:
        captured = [stack.enter_context(CaptureQueriesContext(connections[a])) for a in {"default", alias}]
        yield
    assert [q["sql"] for c in captured for q in c.captured_queries] == []


def _pair_claim(alias: str) -> Claim:
    """A claim of a ``PairJob`` row, as a worker could have received it (pickled, forged)."""
    return Claim(
        model=PairJob,
        pk=(1, 1),
        token=1,
        worker="w",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
        attempt=1,
        alias=alias,
        lease=60.0,
    )


def _fenced(held: Claim) -> None:
    with fenced(held):
        pass  # pragma: no cover - refused on entry


# -- a composite primary key ---------------------------------------------------------------------------------------

COMPOSITE_CALLS: list[tuple[str, Callable[[str], Any], str]] = [
    ("claim_next", lambda a: claim_next(PairJob.objects.using(a), worker="w", lease=60), "queryset"),
    (
        "claim_next model",
        lambda a: claim_next(PairJob, worker="w", lease=60, using=a),  # type: ignore[call-overload]
        "queryset",
    ),
    (
        "claim queryset",
        lambda a: claim(PairJob.objects.using(a).filter(tenant=1), worker="w", lease=60),
        "target",
    ),
    (
        "claim instance",
        lambda a: claim(PairJob(tenant=1, number=1), worker="w", lease=60, using=a),
        "target",
    ),
    ("reclaim_expired", lambda a: reclaim_expired(PairJob.objects.using(a)), "queryset"),
    ("held_by", lambda a: held_by(PairJob.objects.using(a), worker="w"), "queryset"),
    ("heartbeat", lambda a: heartbeat(_pair_claim(a)), "claim.model"),
    ("complete", lambda a: complete(_pair_claim(a), set={"state": "done"}), "claim.model"),
    ("release", lambda a: release(_pair_claim(a)), "claim.model"),
    ("complete_many", lambda a: complete_many([_pair_claim(a)]), "claims item.model"),
    ("release_many", lambda a: release_many([_pair_claim(a)]), "claims item.model"),
    ("fenced", lambda a: _fenced(_pair_claim(a)), "claim.model"),
]


@pytest.mark.parametrize(
    ("call", "parameter"), [(c[1], c[2]) for c in COMPOSITE_CALLS], ids=[c[0] for c in COMPOSITE_CALLS]
)
def test_a_composite_primary_key_is_refused_before_sql(
    alias: str, call: Callable[[str], Any], parameter: str
) -> None:
    PairJob.objects.using(alias).create(tenant=1, number=1)
    with (
        no_sql(alias),
        pytest.raises(TypeError, match=rf"^{parameter}: PairJob has a composite primary key") as raised,
    ):
        call(alias)
    assert "tenant, number" in str(raised.value)
    row = PairJob.objects.using(alias).get()
    assert (row.lease_expires_at, row.claim_token) == (None, 0)


# -- aggregates and window functions in set= ----------------------------------------------------------------------

AGGREGATED_SETS: list[Any] = [
    {"result": Max("name")},
    {"name": Min("state")},
    {"result": Count("pk")},
    {"name": Window(RowNumber())},
    {"result": Window(Rank(), order_by=F("name").asc())},
    {"name": Window(Max("name"))},
    {"result": Coalesce(Max("name"), Value("x"))},  # inside another expression
    {
        "name": Case(
            When(state="pending", then=Window(RowNumber())), default=F("name"), output_field=CharField()
        )
    },
]
AGGREGATED_IDS = ["Max", "Min", "Count", "RowNumber", "Rank", "Window-of-Max", "in-Coalesce", "in-Case"]


def _claimed(alias: str) -> Claim:
    job = Job.objects.using(alias).create(name="a")
    found = claim(job, worker="w", lease=60)
    assert found is not None
    return found


SET_CALLS: list[tuple[str, Callable[[str, Any], Any], str]] = [
    ("claim_next", lambda a, s: claim_next(Job.objects.using(a), worker="w", lease=60, set=s), "set"),
    ("claim", lambda a, s: claim(Job.objects.using(a).filter(name="a"), worker="w", lease=60, set=s), "set"),
    ("reclaim_expired", lambda a, s: reclaim_expired(Job.objects.using(a), set=s), "set"),
    (
        "reclaim_expired exhausted_set",
        lambda a, s: reclaim_expired(Job.objects.using(a), max_attempts=3, exhausted_set=s),
        "exhausted_set",
    ),
    ("complete", lambda a, s: complete(_claimed(a), set=s), "set"),
    ("release", lambda a, s: release(_claimed(a), set=s), "set"),
    ("complete_many", lambda a, s: complete_many([_claimed(a)], set=s), "set"),
    ("release_many", lambda a, s: release_many([_claimed(a)], set=s), "set"),
]


@pytest.mark.parametrize("values", AGGREGATED_SETS, ids=AGGREGATED_IDS)
@pytest.mark.parametrize(
    ("call", "parameter"), [(c[1], c[2]) for c in SET_CALLS], ids=[c[0] for c in SET_CALLS]
)
def test_an_aggregate_or_window_in_set_is_refused_before_sql(
    alias: str, call: Callable[[str, Any], Any], parameter: str, values: dict[str, Any]
) -> None:
    Job.objects.using(alias).create(name="a")
    (field_name,) = values
    # The Claim of complete()/release() is made before the watched block: it is the call's own input.
    held = _claimed(alias) if parameter == "set" and call in [c[1] for c in SET_CALLS[4:]] else None
    before = list(Job.objects.using(alias).order_by("pk").values_list("name", "result", "lease_expires_at"))

    def run() -> Any:
        if held is None:
            return call(alias, values)
        return {
            SET_CALLS[4][1]: lambda: complete(held, set=values),
            SET_CALLS[5][1]: lambda: release(held, set=values),
            SET_CALLS[6][1]: lambda: complete_many([held], set=values),
            SET_CALLS[7][1]: lambda: release_many([held], set=values),
        }[call]()

    with (
        no_sql(alias),
        pytest.raises(
            ValueError, match=rf"^{parameter}\['{field_name}'\] must not use aggregates or window functions"
        ),
    ):
        run()
    after = list(Job.objects.using(alias).order_by("pk").values_list("name", "result", "lease_expires_at"))
    assert after == before


def test_a_subquery_in_set_is_still_accepted(alias: str) -> None:
    """The refusal is of aggregates over the updated rows, not of a (correlated) subquery that aggregates."""
    job = Job.objects.using(alias).create(name="a")
    newest = (
        Job.objects.using(alias)
        .filter(pk=OuterRef("pk"))
        .values("pk")
        .annotate(top=Max("name"))
        .values("top")
    )
    (made,) = claim_next(Job.objects.using(alias), worker="w", lease=60, set={"result": Subquery(newest[:1])})
    assert made.pk == job.pk
    assert Job.objects.using(alias).get(pk=job.pk).result == "a"


# -- window functions (and aggregates) in the queryset ---------------------------------------------------------------

WINDOWED: list[tuple[str, Callable[[str], Any], str]] = [
    (
        "annotate RowNumber",
        lambda a: Job.objects.using(a).annotate(rn=Window(RowNumber())),
        "annotation 'rn'",
    ),
    (
        "annotate Rank ordered",
        lambda a: Job.objects.using(a).annotate(r=Window(Rank(), order_by=F("name").desc())),
        "annotation 'r'",
    ),
    (
        "filter on a window",
        lambda a: Job.objects.using(a).annotate(rn=Window(RowNumber())).filter(rn=1),
        "annotation 'rn'",
    ),
    (
        "annotate Window of Sum",
        lambda a: Job.objects.using(a).annotate(s=Window(Sum("attempts"))),
        "annotation 's'",
    ),
]


def _queryset_calls(qs: Any) -> dict[str, Callable[[], Any]]:
    return {
        "claim_next": lambda: claim_next(qs, worker="w", lease=60),
        "claim": lambda: claim(qs.filter(name="a"), worker="w", lease=60),
        "reclaim_expired": lambda: reclaim_expired(qs),
        "held_by": lambda: held_by(qs, worker="w"),
    }


CALL_NAMES = ["claim_next", "claim", "reclaim_expired", "held_by"]


@pytest.mark.parametrize("call_name", CALL_NAMES)
@pytest.mark.parametrize(("make", "named"), [(w[1], w[2]) for w in WINDOWED], ids=[w[0] for w in WINDOWED])
def test_a_window_function_in_the_queryset_is_refused_before_sql(
    alias: str, call_name: str, make: Callable[[str], Any], named: str
) -> None:
    Job.objects.using(alias).create(name="a")
    parameter = "target" if call_name == "claim" else "queryset"
    queryset = make(alias)
    with (
        no_sql(alias),
        pytest.raises(ValueError, match=rf"^{parameter} must not use window functions \({named}\)"),
    ):
        _queryset_calls(queryset)[call_name]()
    assert Job.objects.using(alias).get().lease_expires_at is None


@pytest.mark.parametrize("call_name", CALL_NAMES)
@pytest.mark.parametrize(
    "ordering",
    [Window(RowNumber()), Window(Rank(), order_by=F("name").asc()).desc()],
    ids=["Window", "Window-desc"],
)
def test_a_queryset_ordered_by_a_window_is_refused_before_sql(
    alias: str, call_name: str, ordering: Any
) -> None:
    Job.objects.using(alias).create(name="a")
    parameter = "target" if call_name == "claim" else "queryset"
    queryset = Job.objects.using(alias).order_by(ordering)
    with (
        no_sql(alias),
        pytest.raises(
            ValueError, match=rf"^{parameter} must not be ordered by aggregates or window functions"
        ),
    ):
        _queryset_calls(queryset)[call_name]()


def test_a_window_inside_a_subquery_filter_is_still_accepted(alias: str) -> None:
    """Only OVER (...) in the locking query itself is refused: a subquery may rank rows."""
    first, _ = (Job.objects.using(alias).create(name=n) for n in ("a", "b"))
    ranked = (
        Job.objects.using(alias).annotate(rn=Window(RowNumber(), order_by=F("pk").asc())).values("pk", "rn")
    )
    wanted = [row["pk"] for row in ranked if row["rn"] == 1]
    (made,) = claim_next(Job.objects.using(alias).filter(Q(pk__in=wanted)), worker="w", lease=60)
    assert made.pk == first.pk


@pytest.mark.parametrize(
    "when",
    [
        Q(Exact(Window(RowNumber()), 1)),
        Q(GreaterThan(Max("attempts"), 1)),
        Q(name="a") & Q(Exact(Window(Rank()), 1)),
    ],
    ids=["window", "aggregate", "combined"],
)
def test_an_aggregate_or_window_in_when_is_refused_before_sql(alias: str, when: Q) -> None:
    Job.objects.using(alias).create(name="a")
    with no_sql(alias), pytest.raises(ValueError, match=r"^when must not use aggregates or window functions"):
        claim(Job.objects.using(alias).filter(name="a"), worker="w", lease=60, when=when)
    assert Job.objects.using(alias).get().lease_expires_at is None


# -- extra(): raw SQL columns and tables -------------------------------------------------------------------------

EXTRA: list[tuple[str, Callable[[str], Any]]] = [
    ("extra select aggregate", lambda a: Job.objects.using(a).extra(select={"n": "COUNT(*)"})),
    ("extra select", lambda a: Job.objects.using(a).extra(select={"one": "1"})),
    (
        "extra tables",
        lambda a: Job.objects.using(a).extra(
            tables=["lockkit_tests_jobtag"], where=["lockkit_tests_jobtag.job_id = lockkit_tests_job.id"]
        ),
    ),
]


@pytest.mark.parametrize("call_name", CALL_NAMES)
@pytest.mark.parametrize("make", [e[1] for e in EXTRA], ids=[e[0] for e in EXTRA])
def test_extra_select_or_tables_are_refused_before_sql(
    alias: str, call_name: str, make: Callable[[str], Any]
) -> None:
    """Raw SQL lockkit cannot see into: an aggregate in it reached PostgreSQL (``NotSupportedError`` after the
    claim's transaction began), and a table in ``FROM`` is locked too where there is no ``FOR UPDATE OF``.
    ``extra(where=...)`` and ``extra(order_by=...)`` filter and order the model's own rows, and are accepted."""
    Job.objects.using(alias).create(name="a")
    parameter = "target" if call_name == "claim" else "queryset"
    with (
        no_sql(alias),
        pytest.raises(ValueError, match=rf"^{parameter} must not use extra\(select=/tables=\)"),
    ):
        _queryset_calls(make(alias))[call_name]()
    assert Job.objects.using(alias).get().lease_expires_at is None
    kept = Job.objects.using(alias).extra(where=["1 = 1"], order_by=["-name"])
    assert len(claim_next(kept, worker="w", lease=60)) == 1  # the next call works
