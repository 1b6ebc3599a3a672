"""claim_next(fetch=True), ordering expressions, and claim(instance) behind a primary/replica router."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import NotSupportedError, connections
from django.db.models import Count, F, OrderBy, Value, Window
from django.db.models.functions import Coalesce, Lower, RowNumber
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from lockkit import AliasMismatch
from lockkit.claims import Claimed, claim, claim_next
from lockkit_tests.models import Job, RankedJob
from lockkit_tests.support.claims_vendors import claims_vendor_params

VENDORS = claims_vendor_params()

# (name, priority) rows; names differ in case so Lower() orders differently from the raw column.
RANKED = [("b", 3), ("D", None), ("a", 1), ("C", 5), ("e", None), ("F", 2)]


def _ranked(alias: str) -> dict[str, Any]:
    rows = RankedJob.objects.using(alias).bulk_create([RankedJob(name=n, priority=p) for n, p in RANKED])
    return {row.name: row.pk for row in rows}


@pytest.mark.parametrize("alias", VENDORS)
@pytest.mark.parametrize(
    ("order_by", "expected"),
    [
        ([F("priority").desc(nulls_last=True), "pk"], ["C", "b", "F", "a", "D", "e"]),
        ([F("priority").asc(nulls_first=True), "pk"], ["D", "e", "a", "F", "b", "C"]),
        ([OrderBy(F("priority"), descending=True, nulls_first=True), "-pk"], ["e", "D", "C", "b", "F", "a"]),
        ([Lower("name").desc()], ["F", "e", "D", "C", "b", "a"]),
        ([Coalesce("priority", Value(4)), "pk"], ["a", "F", "b", "D", "e", "C"]),
        (["-priority", "name"], None),
    ],
    ids=["F-desc-nulls-last", "F-asc-nulls-first", "OrderBy", "Lower-desc", "Coalesce", "strings"],
)
def test_claim_next_honours_ordering_expressions(
    alias: str, order_by: list[Any], expected: list[str] | None
) -> None:
    pks = _ranked(alias)
    if expected is None:  # strings, resolved as order_by() does; compare with the ORM's own order
        expected = list(RankedJob.objects.using(alias).order_by(*order_by).values_list("name", flat=True))
    claims = claim_next(RankedJob.objects.using(alias), worker="w", lease=30, limit=4, order_by=order_by)
    assert [c.pk for c in claims] == [pks[name] for name in expected[:4]]
    rest = claim_next(RankedJob.objects.using(alias), worker="w", lease=30, limit=10, order_by=order_by)
    assert [c.pk for c in rest] == [pks[name] for name in expected[4:]]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "order_by",
    [[Count("id")], [Window(RowNumber(), order_by=F("priority").asc())]],
    ids=["aggregate", "window"],
)
def test_claim_next_refuses_aggregates_and_windows_in_order_by(order_by: list[Any]) -> None:
    RankedJob.objects.create(name="a", priority=1)
    with CaptureQueriesContext(connections["default"]) as queries:
        with pytest.raises(ValueError, match=r"order_by.*(aggregate|window)"):
            claim_next(RankedJob.objects.all(), worker="w", lease=30, order_by=order_by)
    assert len(queries) == 0
    assert RankedJob.objects.get().claim_token == 0


@pytest.mark.parametrize("alias", VENDORS)
def test_claim_next_fetch_returns_the_claimed_instances(alias: str) -> None:
    pks = _ranked(alias)
    with CaptureQueriesContext(connections[alias]) as queries:
        claimed = claim_next(
            RankedJob.objects.using(alias).filter(priority__isnull=False),
            worker="w",
            lease=30,
            limit=3,
            set={"state": "running"},
            order_by=["-priority"],
            fetch=True,
        )
    if alias == "default":
        # The instances come from the claiming statement itself: the call's one message (opening, statement,
        # COMMIT) is the only statement that touches the table.
        touching = [q["sql"] for q in queries.captured_queries if RankedJob._meta.db_table in q["sql"]]
        assert len(touching) == 1, touching
        opening, _, claiming = touching[0].partition("true); ")
        assert opening.startswith("BEGIN; SELECT set_config(")
        assert claiming.startswith("WITH")
    assert all(isinstance(item, Claimed) for item in claimed)
    assert [job.name for job, _ in claimed] == ["C", "b", "F"]
    for job, c in claimed:
        assert isinstance(job, RankedJob)
        assert (job.pk, job._state.db, job._state.adding) == (c.pk, alias, False)
        assert (job.state, job.claimed_by, job.claim_token, job.attempts) == ("running", "w", c.token, 1)
        assert job.lease_expires_at == c.lease_expires_at
        assert job.priority == dict(RANKED)[job.name]
        fresh = RankedJob.objects.using(alias).get(pk=job.pk)
        assert [getattr(fresh, f.attname) for f in RankedJob._meta.concrete_fields] == [
            getattr(job, f.attname) for f in RankedJob._meta.concrete_fields
        ]
    assert pks["C"] == claimed[0].instance.pk
    assert (
        claim_next(RankedJob.objects.using(alias).filter(name="nope"), worker="w", lease=30, fetch=True) == []
    )


# -- claim(instance) and routers -----------------------------------------------------------------------------------


def _job_on_both(pk: int) -> None:
    """The same row on ``default`` (the primary) and ``other`` (its replica's copy)."""
    for alias in ("default", "other"):
        Job.objects.using(alias).create(pk=pk, name="replicated")


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@override_settings(DATABASE_ROUTERS=["lockkit_tests.routers.PrimaryReplicaRouter"])
def test_claim_of_an_instance_read_from_a_replica_claims_on_the_primary() -> None:
    _job_on_both(41)
    job = Job.objects.get(pk=41)
    assert job._state.db == "other"  # read through the router, from the replica
    claimed = claim(job, worker="w", lease=30, set={"state": "running"})
    assert claimed is not None
    assert claimed.alias == "default"
    assert Job.objects.using("default").values_list("claim_token", "state").get(pk=41) == (1, "running")
    assert Job.objects.using("other").values_list("claim_token", "state").get(pk=41) == (0, "pending")
    _job_on_both(42)
    explicit = claim(Job.objects.get(pk=42), worker="w", lease=30, using="default")
    assert explicit is not None
    assert explicit.alias == "default"
    with pytest.raises(AliasMismatch) as raised:
        claim(Job.objects.get(pk=42), worker="w", lease=30, using="other")
    message = str(raised.value)
    assert "using='other'" in message
    assert "'default'" in message
    assert "Pass using='default' or omit using" in message
    assert Job.objects.using("other").get(pk=42).claim_token == 0


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_without_a_router_an_instance_is_claimed_where_it_was_read_and_nowhere_else() -> None:
    _job_on_both(43)
    job = Job.objects.using("other").get(pk=43)
    claimed = claim(job, worker="w", lease=30)
    assert claimed is not None
    assert claimed.alias == "other"
    _job_on_both(44)
    with CaptureQueriesContext(connections["default"]) as queries:
        with pytest.raises(AliasMismatch, match="would be another row"):
            claim(Job.objects.using("other").get(pk=44), worker="w", lease=30, using="default")
    assert len(queries) == 0
    assert Job.objects.using("default").get(pk=43).claim_token == 0
    assert Job.objects.using("default").get(pk=44).claim_token == 0


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_vendor_without_claims_statements_is_refused_before_any_sql(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lockkit.claims import sql as claims_sql

    monkeypatch.delitem(claims_sql._BY_VENDOR, "sqlite")  # as if SQLite had no claims statements
    with CaptureQueriesContext(connections["sqlite"]) as queries:
        with pytest.raises(
            NotSupportedError, match=r"supports .*PostgreSQL.* only; database 'sqlite' is sqlite"
        ):
            claim_next(Job.objects.using("sqlite"), worker="w", lease=1)
    assert len(queries) == 0


@pytest.mark.django_db(transaction=True)
def test_claim_made_signal_carries_the_claims_of_a_fetch() -> None:
    from lockkit import signals

    RankedJob.objects.bulk_create([RankedJob(name="a", priority=1), RankedJob(name="b", priority=2)])
    received: list[Any] = []

    def record(sender: object, **kwargs: Any) -> None:
        received.append(kwargs)

    signals.claim_made.connect(record)
    try:
        claimed = claim_next(RankedJob.objects.all(), worker="w", lease=30, limit=2, fetch=True)
    finally:
        signals.claim_made.disconnect(record)
    assert len(received) == 1
    assert received[0]["claims"] == [c for _, c in claimed]
    assert received[0]["worker"] == "w"
