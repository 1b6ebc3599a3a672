"""Querysets and ``set=`` values the claims cannot use are refused before any SQL, naming the parameter (issue 33).

Each reached the database before failing with an undocumented type: ``claim()`` of a queryset with
``select_related()`` (``FieldError`` after one statement) or ``.values()`` (``TypeError`` after one statement), and
``reclaim_expired(set={"name": <model instance>})`` (``TypeError`` after one statement). The other entry points that
take a queryset accepted both shapes (``claim_next`` with ``select_related()`` on MariaDB would lock the related
rows too, having no ``FOR UPDATE OF``); they refuse them the same way now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models import QuerySet
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from lockkit.claims import (
    Claim,
    claim,
    claim_next,
    complete,
    complete_many,
    heartbeat_held,
    held_by,
    reclaim_expired,
    release,
    release_many,
)
from lockkit_tests.models import OwnedJob, Owner
from lockkit_tests.support.claims_vendors import claims_vendor_params

pytestmark = pytest.mark.parametrize("alias", claims_vendor_params())


@contextmanager
def no_sql(alias: str) -> Iterator[None]:
    """Fail unless the block sends no statement at all on ``alias`` (nor on ``default``)."""
    with ExitStack() as stack:
        captured = [stack.enter_context(CaptureQueriesContext(connections[a])) for a in {"default", alias}]
        yield
    assert [q["sql"] for c in captured for q in c.captured_queries] == []


SHAPES: list[tuple[str, Callable[[QuerySet[Any]], QuerySet[Any]], str]] = [
    ("select_related", lambda qs: qs.select_related("owner"), "select_related"),
    ("select_related()", lambda qs: qs.select_related(), "select_related"),
    ("values", lambda qs: qs.values(), r"values\(\) or values_list\(\)"),
    ("values fields", lambda qs: qs.values("pk", "name"), r"values\(\) or values_list\(\)"),
    ("values_list", lambda qs: qs.values_list("pk", flat=True), r"values\(\) or values_list\(\)"),
]

CALLS: list[tuple[str, Callable[[QuerySet[Any]], Any], str]] = [
    ("claim", lambda qs: claim(qs.filter(name="a"), worker="w", lease=60), "target"),
    ("claim_next", lambda qs: claim_next(qs, worker="w", lease=60), "queryset"),
    ("reclaim_expired", lambda qs: reclaim_expired(qs, set={"name": "b"}), "queryset"),
    ("held_by", lambda qs: held_by(qs, worker="w"), "queryset"),
    ("heartbeat_held", lambda qs: heartbeat_held(qs, worker="w", lease=60), "model_or_queryset"),
]


@pytest.mark.parametrize(("shape", "message"), [(s[1], s[2]) for s in SHAPES], ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize(("call", "parameter"), [(c[1], c[2]) for c in CALLS], ids=[c[0] for c in CALLS])
def test_a_queryset_of_other_rows_or_of_values_is_refused_before_sql(
    alias: str,
    shape: Callable[[QuerySet[Any]], QuerySet[Any]],
    message: str,
    call: Callable[[QuerySet[Any]], Any],
    parameter: str,
) -> None:
    owner = Owner.objects.using(alias).create(name="o")
    OwnedJob.objects.using(alias).create(name="a", owner=owner)
    with no_sql(alias), pytest.raises(ValueError, match=rf"^{parameter} must not use {message}"):
        call(shape(OwnedJob.objects.using(alias)))
    row = OwnedJob.objects.using(alias).get()
    assert (row.lease_expires_at, row.claim_token) == (None, 0)


def _claim(alias: str, pk: Any) -> Claim:
    return Claim(
        model=OwnedJob,
        pk=pk,
        token=1,
        worker="w",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
        attempt=1,
        alias=alias,
        lease=60.0,
    )


SETS: list[tuple[str, Callable[[str, Any, dict[str, Any]], Any]]] = [
    (
        "claim",
        lambda a, pk, values: claim(
            OwnedJob.objects.using(a).filter(pk=pk), worker="w", lease=60, set=values
        ),
    ),
    (
        "claim_next",
        lambda a, pk, values: claim_next(OwnedJob.objects.using(a), worker="w", lease=60, set=values),
    ),
    ("reclaim_expired", lambda a, pk, values: reclaim_expired(OwnedJob.objects.using(a), set=values)),
    (
        "reclaim_expired exhausted",
        lambda a, pk, values: reclaim_expired(
            OwnedJob.objects.using(a), set={"name": "b"}, max_attempts=2, exhausted_set=values
        ),
    ),
    ("complete", lambda a, pk, values: complete(_claim(a, pk), set=values)),
    ("release", lambda a, pk, values: release(_claim(a, pk), set=values)),
    ("complete_many", lambda a, pk, values: complete_many([_claim(a, pk)], set=values)),
    ("release_many", lambda a, pk, values: release_many([_claim(a, pk)], set=values)),
]


@pytest.mark.parametrize("call", [s[1] for s in SETS], ids=[s[0] for s in SETS])
def test_a_model_instance_in_set_for_a_column_that_is_not_its_key_is_refused_before_sql(
    alias: str, call: Callable[[str, Any, dict[str, Any]], Any]
) -> None:
    owner = Owner.objects.using(alias).create(name="o")
    job = OwnedJob.objects.using(alias).create(name="a")
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"name": owner}, TypeError, r"\['name'\] must not be a model instance"),
        ({"owner": job}, TypeError, r"\['owner'\] must be a Owner instance, not a OwnedJob"),
        ({"owner": Owner(name="unsaved")}, ValueError, r"\['owner'\] is an unsaved Owner"),
    ]
    for values, error, said in cases:
        with no_sql(alias), pytest.raises(error, match=rf"^(exhausted_)?set{said}"):
            call(alias, job.pk, values)
    row = OwnedJob.objects.using(alias).get()
    assert (row.name, row.owner_id, row.lease_expires_at, row.claim_token) == ("a", None, None, 0)


def test_a_saved_instance_of_the_related_model_is_written_as_its_key(alias: str) -> None:
    owner = Owner.objects.using(alias).create(name="o")
    OwnedJob.objects.using(alias).create(name="a")
    made = claim_next(OwnedJob.objects.using(alias), worker="w", lease=60, set={"owner": owner})
    assert len(made) == 1
    OwnedJob.objects.using(alias).update(lease_expires_at=timezone.now() - timedelta(minutes=1))
    assert (
        reclaim_expired(
            OwnedJob.objects.using(alias), set={"owner": None}, max_attempts=1, exhausted_set={"owner": owner}
        )
        == 1
    )
    row = OwnedJob.objects.using(alias).get()
    assert (row.owner_id, row.lease_expires_at) == (owner.pk, None)
