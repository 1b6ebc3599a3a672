"""A completion and the next claim in one message and one transaction on PostgreSQL (issue 34).

``lockkit.claims.chaining.complete_then_claim_next`` sends ``BEGIN; SELECT set_config(...); <fenced UPDATE>;
<claiming UPDATE>; COMMIT``: both commit or neither does, and a stale completion is reported while the claim
proceeds.
"""

from __future__ import annotations

import pytest
from django.db import DataError, connection
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL
from django.test.utils import CaptureQueriesContext

from lockkit.claims import StaleClaim, claim_next
from lockkit.claims.api import NextClaims
from lockkit.claims.chaining import complete_then_claim_next
from lockkit_harness.proxy import Action, FaultProxy
from lockkit_tests.models import Job
from lockkit_tests.support.claims_helpers import expire

pytestmark = pytest.mark.django_db(transaction=True)


def _pending() -> QuerySet[Job]:
    return Job.objects.filter(state="pending")


def test_completion_and_next_claim_are_one_message() -> None:
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    (first,) = claim_next(_pending(), worker="w", lease=30, set={"state": "running"}, order_by=["name"])
    with CaptureQueriesContext(connection) as queries:
        chained = complete_then_claim_next(
            first,
            {"state": "done"},
            NextClaims(_pending(), worker="w", lease=30, order_by=["name"], fetch=True),
        )
    (message,) = [query["sql"] for query in queries.captured_queries]
    assert message.startswith("BEGIN; ")
    assert message.endswith("; COMMIT")
    assert message.count('UPDATE "lockkit_tests_job" SET') == 2
    assert chained.completed
    assert chained.error is None
    ((job, claim),) = chained.claimed
    assert job.name == "b"
    assert claim.worker == "w"
    a, b = Job.objects.order_by("name")
    assert (a.state, a.lease_expires_at, a.claim_token) == ("done", None, first.token)
    assert b.claimed_by == "w"
    assert b.lease_expires_at is not None
    # The next call on the connection works (it is idle, in autocommit).
    assert claim_next(_pending(), worker="w", lease=30) == []


def test_stale_completion_is_reported_and_the_claim_proceeds() -> None:
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    (first,) = claim_next(_pending(), worker="w", lease=30, order_by=["name"])
    expire(first.pk)
    (taken,) = claim_next(Job.objects.filter(pk=first.pk), worker="other", lease=30, expired=True)
    chained = complete_then_claim_next(
        first,
        {"state": "done"},
        NextClaims(_pending().exclude(pk=first.pk), worker="w", lease=30, fetch=True),
    )
    assert not chained.completed
    assert isinstance(chained.error, StaleClaim)
    assert chained.error.holders == {first.pk: ("other", taken.token)}
    ((job, _),) = chained.claimed
    assert job.name == "b"
    a = Job.objects.get(name="a")
    assert (a.state, a.claimed_by, a.claim_token) == ("pending", "other", taken.token)  # not overwritten


def test_a_failed_message_writes_neither() -> None:
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    (first,) = claim_next(_pending(), worker="w", lease=30, order_by=["name"])
    with pytest.raises(DataError):  # the completion fails in the database: the whole transaction rolls back
        complete_then_claim_next(
            first,
            {"result": RawSQL("(1 / 0)::text", [])},
            NextClaims(_pending(), worker="w", lease=30, fetch=True),
        )
    a, b = Job.objects.order_by("name")
    assert a.lease_expires_at is not None
    assert a.claim_token == first.token
    assert b.lease_expires_at is None  # not claimed
    # The next call on the connection works.
    assert [claim.pk for claim in claim_next(_pending(), worker="w", lease=30)] == [b.pk]


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
@pytest.mark.parametrize("action", ["deliver", "abort"])
@pytest.mark.parametrize("queued", [True, False])
def test_a_lost_reply_is_decided_from_the_rows(
    through_proxy: tuple[str, FaultProxy], action: Action, queued: bool
) -> None:
    """Committed with its reply cut, or never sent: the completion is done once and the claims come back."""
    alias, proxy = through_proxy
    Job.objects.bulk_create([Job(name="a"), *([Job(name="b")] if queued else [])])
    pending = Job.objects.using(alias).filter(state="pending")
    (first,) = claim_next(pending, worker="w", lease=30, order_by=["name"])
    proxy.arm(action)  # deliver: the server runs the whole message, COMMIT included; abort: it never arrives
    chained = complete_then_claim_next(
        first, {"state": "done"}, NextClaims(pending, worker="w", lease=30, fetch=True)
    )
    assert proxy.cuts[action] == 1
    assert chained.completed
    assert chained.error is None
    a = Job.objects.get(name="a")
    assert (a.state, a.lease_expires_at, a.claim_token) == ("done", None, first.token)
    assert [job.name for job, _ in chained.claimed] == (["b"] if queued else [])
    if queued:
        b = Job.objects.get(name="b")
        assert (b.claimed_by, b.claim_token) == ("w", chained.claimed[0][1].token)
    # The next call in the same process works, on a new connection.
    assert claim_next(pending, worker="w", lease=30) == []
