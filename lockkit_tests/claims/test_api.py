"""lockkit.claims on one connection: what each call writes, fencing, reclaiming, and input validation."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.db.models import Count, F, Q, Window
from django.db.models.functions import RowNumber
from django.test.utils import CaptureQueriesContext

import lockkit
import lockkit.claims
from lockkit.claims import (
    Claim,
    StaleClaim,
    claim,
    claim_next,
    complete,
    complete_many,
    heartbeat,
    reclaim_expired,
    release,
    release_many,
)
from lockkit.errors import AliasMismatch, LockError
from lockkit_tests.models import Job, JobTag, NotClaimable, RemoteItem, UrgentJob
from lockkit_tests.support.claims_helpers import (
    claims_statements,
    db_now,
    expire,
    snapshot,
    wait_for_db_clock,
)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])

PENDING = Job.objects.filter(state="pending")


def make_jobs(n: int, **fields: Any) -> list[Job]:
    return Job.objects.bulk_create([Job(name=f"job-{i}", **fields) for i in range(n)])


# -- claim_next ----------------------------------------------------------------------------------------------


def test_claim_next_claims_in_order_and_writes_claim_fields_in_one_statement() -> None:
    jobs = make_jobs(5)
    before = db_now()
    with CaptureQueriesContext(connection) as queries:
        claims = claim_next(PENDING, worker="w1", lease=30, limit=3, set={"state": "running"})
    (statement,) = claims_statements(queries)
    assert "AS MATERIALIZED" in statement
    assert "FOR NO KEY UPDATE OF" in statement
    assert "SKIP LOCKED" in statement
    assert "RETURNING" in statement
    assert " IN (SELECT" not in statement
    assert [c.pk for c in claims] == [j.pk for j in jobs[:3]]
    for c in claims:
        assert (c.model, c.worker, c.token, c.attempt, c.alias, c.lease) == (Job, "w1", 1, 1, "default", 30.0)
        row = Job.objects.get(pk=c.pk)
        assert (row.state, row.claimed_by, row.claim_token, row.attempts) == ("running", "w1", 1, 1)
        assert row.lease_expires_at == c.lease_expires_at
        assert row.claimed_at is not None
        assert row.claimed_at >= before
        assert row.lease_expires_at - row.claimed_at == timedelta(seconds=30)
    assert Job.objects.filter(lease_expires_at__isnull=True).count() == 2


def test_claim_next_commits_before_returning() -> None:
    (job,) = make_jobs(1)
    (c,) = claim_next(PENDING, worker="w1", lease=30)
    assert not connection.in_atomic_block
    other = connections.create_connection("default")  # another session sees the claim: it is committed
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT claim_token, claimed_by FROM lockkit_tests_job WHERE id = %s", [job.pk])
            assert cursor.fetchone() == (c.token, "w1")
    finally:
        other.close()


def test_querysets_that_match_nothing_run_no_sql() -> None:
    make_jobs(1)
    for empty in (Job.objects.none(), Job.objects.filter(pk__in=[])):
        with CaptureQueriesContext(connection) as queries:
            assert claim_next(empty, worker="w", lease=1) == []
            assert reclaim_expired(empty) == 0
        assert len(queries) == 0
        assert claim(empty, worker="w", lease=1) is None
    assert Job.objects.get().claim_token == 0


def test_claim_next_respects_order_by_and_skips_claimed_rows() -> None:
    jobs = make_jobs(4)
    first = claim_next(Job.objects.all(), worker="a", lease=30, order_by=["-pk"])
    assert [c.pk for c in first] == [jobs[3].pk]
    rest = claim_next(Job.objects.all(), worker="b", lease=30, limit=10, order_by=("-name",))
    assert [c.pk for c in rest] == [jobs[2].pk, jobs[1].pk, jobs[0].pk]
    assert claim_next(Job.objects.all(), worker="c", lease=30, limit=10) == []


def test_claim_next_never_claims_more_than_limit_when_the_filter_joins_duplicates() -> None:
    jobs = make_jobs(6)
    JobTag.objects.bulk_create([JobTag(job=j, name=n) for j in jobs for n in ("a", "b")])
    claims = claim_next(Job.objects.filter(tags__name__in=["a", "b"]), worker="w", lease=30, limit=4)
    assert 1 <= len(claims) <= 4
    assert len({c.pk for c in claims}) == len(claims)
    assert Job.objects.filter(lease_expires_at__isnull=False).count() == len(claims)
    assert set(Job.objects.filter(attempts__gt=1).values_list("pk", flat=True)) == set()


def test_claim_next_with_timedelta_lease_and_expression_in_set() -> None:
    make_jobs(1, result="x")
    (c,) = claim_next(PENDING, worker="w", lease=timedelta(minutes=2), set={"result": F("name")})
    row = Job.objects.get(pk=c.pk)
    assert row.result == row.name
    assert c.lease == 120.0


def test_claim_next_on_the_routed_alias() -> None:
    make_jobs(1)
    Job.objects.using("other").bulk_create([Job(name="remote")])
    (c,) = claim_next(Job.objects.using("other"), worker="w", lease=30)
    assert c.alias == "other"
    assert Job.objects.using("other").get(pk=c.pk).claim_token == 1
    assert Job.objects.get().claim_token == 0
    complete(c, set={"state": "done"})
    assert Job.objects.using("other").get(pk=c.pk).state == "done"


# -- claim ---------------------------------------------------------------------------------------------------


def test_claim_one_instance_and_when_condition() -> None:
    job, other = make_jobs(2)
    assert claim(job, worker="w", lease=10, when=Q(state="done")) is None
    assert snapshot(job.pk)["claim_token"] == 0
    c = claim(job, worker="w", lease=10, when=Q(state="pending"), set={"state": "running"})
    assert c is not None
    assert (c.pk, c.token, c.attempt) == (job.pk, 1, 1)
    assert Job.objects.get(pk=job.pk).state == "running"
    assert claim(job, worker="x", lease=10) is None  # already claimed
    assert Job.objects.get(pk=other.pk).claim_token == 0
    c2 = claim(Job.objects.filter(pk=other.pk), worker="x", lease=10)
    assert c2 is not None
    assert c2.pk == other.pk


def test_claim_queryset_matching_several_rows_claims_nothing() -> None:
    make_jobs(2)
    with pytest.raises(Job.MultipleObjectsReturned):
        claim(Job.objects.all(), worker="w", lease=10)
    assert Job.objects.filter(claim_token=0).count() == 2


def test_claim_a_missing_row_returns_none() -> None:
    (job,) = make_jobs(1)
    Job.objects.all().delete()
    assert claim(job, worker="w", lease=10) is None


# -- fencing -------------------------------------------------------------------------------------------------


def test_complete_release_heartbeat_are_fenced_by_the_token() -> None:
    (job,) = make_jobs(1)
    (c,) = claim_next(PENDING, worker="w", lease=30, set={"state": "running"})
    beat = heartbeat(c, lease=60)
    assert beat.token == c.token
    assert beat.lease == 60.0
    assert beat.lease_expires_at > c.lease_expires_at
    assert Job.objects.get(pk=job.pk).lease_expires_at == beat.lease_expires_at
    release(beat, set={"state": "pending"})
    row = snapshot(job.pk)
    assert (row["state"], row["lease_expires_at"], row["claim_token"]) == ("pending", None, 1)
    for stale_call in (
        lambda: heartbeat(c),
        lambda: complete(c, set={"state": "done"}),
        lambda: release(c, set={"state": "x"}),
    ):
        with pytest.raises(StaleClaim) as info:
            stale_call()
        assert info.value.claims == (c,)
        assert isinstance(info.value, LockError)
        assert lockkit.classify(info.value) is None
        assert snapshot(job.pk) == row
    (c2,) = claim_next(PENDING, worker="w2", lease=30)
    assert (c2.token, c2.attempt) == (2, 2)
    complete(c2, set={"state": "done", "result": "ok"})
    with pytest.raises(StaleClaim):
        complete(c2, set={"result": "twice"})
    assert Job.objects.get(pk=job.pk).result == "ok"


def test_complete_many_writes_all_in_one_statement_or_nothing() -> None:
    make_jobs(4)
    claims = claim_next(PENDING, worker="w", lease=30, limit=4, set={"state": "running"})
    expire(claims[2].pk)
    assert reclaim_expired(Job.objects.all(), set={"state": "pending"}) == 1
    before = {c.pk: snapshot(c.pk) for c in claims}
    with CaptureQueriesContext(connection) as queries, pytest.raises(StaleClaim) as info:
        complete_many(claims, set={"state": "done"})
    assert len(claims_statements(queries, stale=True)) == 1
    assert [c.pk for c in info.value.claims] == [claims[2].pk]
    assert {c.pk: snapshot(c.pk) for c in claims} == before
    live = [c for c in claims if c.pk != claims[2].pk]
    with CaptureQueriesContext(connection) as queries:
        complete_many(live, set={"state": "done"})
    assert len(claims_statements(queries)) == 1
    assert Job.objects.filter(state="done", lease_expires_at__isnull=True).count() == 3
    complete_many([])  # nothing to do, no SQL


def test_release_many_frees_rows() -> None:
    make_jobs(3)
    claims = claim_next(PENDING, worker="w", lease=30, limit=3, set={"state": "running"})
    release_many(claims, set={"state": "pending"})
    assert [c.attempt for c in claim_next(PENDING, worker="w", lease=30, limit=3)] == [2, 2, 2]


def test_release_not_attempted_takes_the_attempt_back_in_the_fenced_statement() -> None:
    (job,) = make_jobs(1)
    for _ in range(3):  # given back unstarted again and again: never more than one attempt counted
        (c,) = claim_next(PENDING, worker="w", lease=30, set={"state": "running"})
        assert c.attempt == 1
        with CaptureQueriesContext(connection) as queries:
            release(c, set={"state": "pending"}, attempted=False)
        assert len(claims_statements(queries)) == 1
        row = snapshot(job.pk)
        assert (row["state"], row["lease_expires_at"], row["attempts"]) == ("pending", None, 0)
        with pytest.raises(StaleClaim):  # fenced: the ended claim takes nothing back twice
            release(c, attempted=False)
        assert snapshot(job.pk) == row
    (c,) = claim_next(PENDING, worker="w", lease=30)
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(TypeError, match="attempted must be a bool, not str"):
            release(c, attempted="no")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="attempts"):
            release(c, set={"attempts": 5}, attempted=False)
    assert queries.captured_queries == []  # refused before any SQL
    release(c)  # the default keeps the attempt counted
    assert snapshot(job.pk)["attempts"] == 1


def test_complete_inside_the_callers_transaction_rolls_back_with_it() -> None:
    (job,) = make_jobs(1)
    (c,) = claim_next(PENDING, worker="w", lease=30)

    def complete_then_fail() -> None:
        with transaction.atomic():
            complete(c, set={"state": "done"})
            raise RuntimeError("the result write failed")

    with pytest.raises(RuntimeError):
        complete_then_fail()
    assert snapshot(job.pk)["state"] == "pending"
    assert snapshot(job.pk)["lease_expires_at"] is not None
    complete(c, set={"state": "done"})
    assert snapshot(job.pk)["state"] == "done"


def test_stale_complete_rolls_back_the_result_written_with_it() -> None:
    (job,) = make_jobs(1)
    (old,) = claim_next(PENDING, worker="old", lease=30, set={"state": "running"})
    expire(old.pk)
    assert reclaim_expired(Job.objects.all(), set={"state": "pending"}) == 1
    (new,) = claim_next(PENDING, worker="new", lease=30, set={"state": "running"})
    # The docs' worker loop: the result and the completion commit together, or neither.
    with pytest.raises(StaleClaim), transaction.atomic():
        Job.objects.filter(pk=old.pk).update(result="stale result")
        complete(old, set={"state": "done"})
    row = snapshot(job.pk)
    assert (row["result"], row["state"], row["claim_token"], row["claimed_by"]) == ("", "running", 2, "new")
    assert new.token == 2


# -- reclaim_expired -----------------------------------------------------------------------------------------


def test_reclaim_expired_leaves_live_claims_alone_and_uses_the_db_clock() -> None:
    jobs = make_jobs(3)
    short = claim(jobs[0], worker="short", lease=0.3, set={"state": "running"})
    long = claim(jobs[1], worker="long", lease=60, set={"state": "running"})
    assert short is not None
    assert long is not None
    wait_for_db_clock(short.lease_expires_at)
    assert reclaim_expired(Job.objects.all(), set={"state": "pending"}) == 1
    rows = {j.pk: snapshot(j.pk) for j in jobs}
    assert (rows[jobs[0].pk]["state"], rows[jobs[0].pk]["lease_expires_at"]) == ("pending", None)
    assert rows[jobs[1].pk]["lease_expires_at"] == long.lease_expires_at
    assert rows[jobs[2].pk]["claim_token"] == 0
    assert reclaim_expired(Job.objects.all(), set={"state": "pending"}) == 0
    with pytest.raises(StaleClaim):
        complete(short)


def test_reclaim_expired_only_within_the_queryset() -> None:
    a, b = make_jobs(2)
    _ca, _cb = claim_next(Job.objects.all(), worker="w", lease=30, limit=2)
    expire(a.pk)
    expire(b.pk)
    assert reclaim_expired(Job.objects.filter(pk=a.pk)) == 1
    assert snapshot(b.pk)["lease_expires_at"] is not None


def test_max_attempts_moves_an_abandoned_job_to_the_exhausted_state() -> None:
    (job,) = make_jobs(1)
    outcomes = []
    for _ in range(3):
        (c,) = claim_next(PENDING, worker="crashy", lease=30, set={"state": "running"})
        expire(c.pk)
        changed = reclaim_expired(
            Job.objects.all(),
            set={"state": "pending"},
            max_attempts=3,
            exhausted_set={"state": "failed", "result": "gave up"},
        )
        row = snapshot(job.pk)
        outcomes.append((changed, c.attempt, row["state"], row["result"], row["lease_expires_at"]))
    assert outcomes == [
        (1, 1, "pending", "", None),
        (1, 2, "pending", "", None),
        (1, 3, "failed", "gave up", None),
    ]
    assert claim_next(PENDING, worker="w", lease=30) == []


def test_heartbeat_extends_the_lease_past_reclaim() -> None:
    (job,) = make_jobs(1)
    (c,) = claim_next(PENDING, worker="w", lease=0.3)
    renewed = heartbeat(c, lease=30)
    wait_for_db_clock(c.lease_expires_at)  # the original lease is over
    assert reclaim_expired(Job.objects.all()) == 0
    assert snapshot(job.pk)["lease_expires_at"] == renewed.lease_expires_at
    stopped = heartbeat(renewed, lease=0.3)
    wait_for_db_clock(stopped.lease_expires_at)
    assert reclaim_expired(Job.objects.all()) == 1
    with pytest.raises(StaleClaim):
        heartbeat(stopped)


# -- validation, before any SQL ------------------------------------------------------------------------------


def _claim_of(pk: Any = 1, **changes: Any) -> Claim:
    values: dict[str, Any] = {
        "model": Job,
        "pk": pk,
        "token": 1,
        "worker": "w",
        "lease_expires_at": datetime(2030, 1, 1, tzinfo=UTC),
        "attempt": 1,
        "alias": "default",
        "lease": 1.0,
    }
    values.update(changes)
    return Claim(**values)


# The calls below break the annotations on purpose: reach the functions through an untyped namespace.
_loose: Any = lockkit.claims

BAD_CALLS: list[tuple[str, Any, type[Exception], str]] = [
    ("lease zero", lambda: _loose.claim_next(PENDING, worker="w", lease=0), ValueError, "lease"),
    ("lease negative", lambda: _loose.claim_next(PENDING, worker="w", lease=-1), ValueError, "lease"),
    ("lease nan", lambda: _loose.claim_next(PENDING, worker="w", lease=float("nan")), ValueError, "lease"),
    ("lease inf", lambda: _loose.claim_next(PENDING, worker="w", lease=float("inf")), ValueError, "lease"),
    ("lease bool", lambda: _loose.claim_next(PENDING, worker="w", lease=True), TypeError, "lease"),
    ("lease str", lambda: _loose.claim_next(PENDING, worker="w", lease="5"), TypeError, "lease"),
    ("lease None", lambda: _loose.claim_next(PENDING, worker="w", lease=None), TypeError, "lease"),
    (
        "negative timedelta",
        lambda: _loose.claim_next(PENDING, worker="w", lease=timedelta(-1)),
        ValueError,
        "lease",
    ),
    ("limit zero", lambda: _loose.claim_next(PENDING, worker="w", lease=1, limit=0), ValueError, "limit"),
    ("limit bool", lambda: _loose.claim_next(PENDING, worker="w", lease=1, limit=True), TypeError, "limit"),
    ("limit float", lambda: _loose.claim_next(PENDING, worker="w", lease=1, limit=2.0), TypeError, "limit"),
    ("worker empty", lambda: _loose.claim_next(PENDING, worker=" ", lease=1), ValueError, "worker"),
    ("worker int", lambda: _loose.claim_next(PENDING, worker=3, lease=1), TypeError, "worker"),
    ("worker long", lambda: _loose.claim_next(PENDING, worker="w" * 256, lease=1), ValueError, "worker"),
    (
        "no mixin",
        lambda: _loose.claim_next(NotClaimable.objects.all(), worker="w", lease=1),
        TypeError,
        "Claimable",
    ),
    ("no mixin row", lambda: _loose.claim(NotClaimable(pk=1), worker="w", lease=1), TypeError, "Claimable"),
    ("unsaved", lambda: _loose.claim(Job(), worker="w", lease=1), ValueError, "unsaved"),
    ("claim list", lambda: _loose.claim([1], worker="w", lease=1), TypeError, "target"),
    ("queryset list", lambda: _loose.claim_next([1], worker="w", lease=1), TypeError, "queryset"),
    ("sliced", lambda: _loose.claim_next(PENDING[:3], worker="w", lease=1), ValueError, "sliced"),
    ("distinct", lambda: _loose.claim_next(PENDING.distinct(), worker="w", lease=1), ValueError, "distinct"),
    (
        "order_by str",
        lambda: _loose.claim_next(PENDING, worker="w", lease=1, order_by="pk"),
        TypeError,
        "order_by",
    ),
    (
        "when dict",
        lambda: _loose.claim(Job(pk=1), worker="w", lease=1, when={"state": "x"}),
        TypeError,
        "when",
    ),
    (
        "set unknown",
        lambda: _loose.claim_next(PENDING, worker="w", lease=1, set={"nope": 1}),
        ValueError,
        "nope",
    ),
    (
        "set claim field",
        lambda: _loose.claim_next(PENDING, worker="w", lease=1, set={"claim_token": 9}),
        ValueError,
        "set",
    ),
    (
        "set pk",
        lambda: _loose.claim_next(PENDING, worker="w", lease=1, set={"id": 9}),
        ValueError,
        "primary key",
    ),
    (
        "set list",
        lambda: _loose.claim_next(PENDING, worker="w", lease=1, set=[("state", "x")]),
        TypeError,
        "set",
    ),
    ("bad alias", lambda: _loose.claim_next(PENDING, worker="w", lease=1, using="nope"), ValueError, "using"),
    (
        "mismatch",
        lambda: _loose.claim_next(PENDING.using("other"), worker="w", lease=1, using="default"),
        AliasMismatch,
        "",
    ),
    (
        "claim fields in a parent table",
        lambda: _loose.claim_next(UrgentJob.objects.all(), worker="w", lease=1),
        TypeError,
        "parent",
    ),
    ("heartbeat str", lambda: _loose.heartbeat("token"), TypeError, "claim"),
    ("heartbeat lease", lambda: _loose.heartbeat(_claim_of(), lease=0), ValueError, "lease"),
    ("complete int", lambda: _loose.complete(7), TypeError, "claim"),
    (
        "claim of another model",
        lambda: _loose.complete(_claim_of(model=NotClaimable)),
        TypeError,
        "Claimable",
    ),
    ("complete_many one", lambda: _loose.complete_many(_claim_of()), TypeError, "claims"),
    (
        "complete_many mixed",
        lambda: _loose.complete_many([_claim_of(1), _claim_of(2, alias="other")]),
        ValueError,
        "one",
    ),
    (
        "complete_many dup",
        lambda: _loose.complete_many([_claim_of(1), _claim_of(1)]),
        ValueError,
        "more than once",
    ),
    ("complete set", lambda: _loose.complete(_claim_of(), set={"attempts": 0}), ValueError, "set"),
    (
        "reclaim max zero",
        lambda: _loose.reclaim_expired(PENDING, max_attempts=0, exhausted_set={}),
        ValueError,
        "max_att",
    ),
    (
        "reclaim max alone",
        lambda: _loose.reclaim_expired(PENDING, max_attempts=3),
        ValueError,
        "exhausted_set",
    ),
    (
        "reclaim exhausted",
        lambda: _loose.reclaim_expired(PENDING, max_attempts=2, exhausted_set={"x": 1}),
        ValueError,
        "x",
    ),
    ("reclaim no mixin", lambda: _loose.reclaim_expired(NotClaimable), TypeError, "Claimable"),
    (
        "routed model without the mixin",
        lambda: _loose.claim_next(RemoteItem.objects.all(), worker="w", lease=1),
        TypeError,
        "Claimable",
    ),
]


@pytest.mark.parametrize(("label", "call", "error", "words"), BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_input_is_refused_before_any_sql(
    label: str, call: Any, error: type[Exception], words: str
) -> None:
    captured = [CaptureQueriesContext(connections[alias]) for alias in ("default", "other")]
    for context in captured:
        context.__enter__()
    try:
        with pytest.raises(error) as info:
            call()
    finally:
        for context in captured:
            context.__exit__(None, None, None)
    assert words in str(info.value)
    assert [len(c) for c in captured] == [0, 0]


def test_lockkit_imports_without_the_app_registry_and_reexports_lazily() -> None:
    code = (
        "import sys, lockkit\n"
        "assert 'lockkit.claims' not in sys.modules\n"
        "assert lockkit.StaleClaim.__mro__[1] is lockkit.LockError\n"
        # Before the app registry is ready a claims name is an AttributeError (hasattr() stays safe), saying why.
        "assert not hasattr(lockkit, 'claim_next') and not hasattr(lockkit, 'no_such_name')\n"
        "try:\n"
        "    lockkit.claim_next\n"
        "except AttributeError as error:\n"
        "    assert 'app registry' in str(error), error\n"
        "import django; django.setup()\n"
        "from lockkit import claims\n"
        "from lockkit.claims import claim_next\n"
        "assert lockkit.claim_next is claim_next and lockkit.Claimable.__name__ == 'Claimable'\n"
        "assert all(getattr(lockkit, name) is getattr(claims, name) for name in claims.__all__)\n"
        "assert not hasattr(lockkit, 'no_such_name') and not hasattr(lockkit, 'api')\n"
        # from lockkit import * never imports lockkit.claims: only the error class, defined in lockkit.errors, is shared.
        "assert set(claims.__all__) & set(lockkit.__all__) == {'StaleClaim'}\n"
    )
    env_settings = {"DJANGO_SETTINGS_MODULE": "lockkit_tests.settings"}
    import os

    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env_settings},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_claim_next_refuses_aggregates_and_huge_limits_before_sql() -> None:
    from lockkit.claims import claim_next
    from lockkit_tests.models import Job

    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(ValueError, match="limit"):
            claim_next(Job.objects.all(), worker="w", lease=5, limit=10**20)
        with pytest.raises(ValueError, match="aggregate"):
            claim_next(Job.objects.annotate(n=Count("tags")).filter(n=0), worker="w", lease=5)
    assert len(queries) == 0


def test_the_same_row_as_int_and_str_pk_is_refused_before_sql() -> None:
    job = Job.objects.create(name="a")
    (held,) = claim_next(Job.objects.all(), worker="w", lease=60)
    twin = replace(held, pk=str(held.pk))
    with CaptureQueriesContext(connection) as queries, pytest.raises(ValueError, match="same row"):
        complete_many([held, twin], set={"state": "done"})
    assert len(queries) == 0
    job.refresh_from_db()
    assert job.state == "pending"
    assert job.lease_expires_at is not None  # still claimed: nothing was written


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_an_instance_is_claimed_on_its_own_database_only() -> None:
    job = Job.objects.create(name="on-default")
    twin = Job.objects.using("other").create(pk=job.pk, name="on-other")
    with pytest.raises(lockkit.AliasMismatch):
        claim(job, worker="w", lease=60, using="other")
    assert Job.objects.using("other").get(pk=twin.pk).claimed_by in (None, "")


@pytest.mark.parametrize("lease", [-5.0, 0.0, float("nan")])
def test_a_travelled_claim_with_a_bad_lease_is_refused_before_sql(lease: float) -> None:
    Job.objects.create(name="a")
    (held,) = claim_next(Job.objects.all(), worker="w", lease=60)
    with CaptureQueriesContext(connection) as queries, pytest.raises(ValueError, match="lease"):
        heartbeat(replace(held, lease=lease))
    assert len(queries) == 0


@pytest.mark.parametrize(("field", "value"), [("token", 2**64), ("token", -1), ("token", True), ("pk", None)])
def test_a_travelled_claim_with_a_bad_token_or_pk_is_refused_before_sql(field: str, value: Any) -> None:
    Job.objects.create(name="a")
    (held,) = claim_next(Job.objects.all(), worker="w", lease=60)
    with CaptureQueriesContext(connection) as queries, pytest.raises(ValueError, match=field):
        complete_many([replace(held, **{field: value})])
    assert len(queries) == 0


def test_empty_batches_still_check_the_type_of_set() -> None:
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(TypeError, match="set"):
            complete_many([], set=[("state", "done")])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="set"):
            release_many([], set="pending")  # type: ignore[arg-type]
        complete_many([], set={"state": "done"})  # nothing to write
    assert len(queries) == 0


def test_worker_names_with_nul_and_window_ordering_are_refused_before_sql() -> None:
    Job.objects.create(name="a")
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(ValueError, match="NUL"):
            claim_next(Job.objects.all(), worker="w\x00x", lease=60)
        with pytest.raises(ValueError, match="window"):
            claim_next(Job.objects.all(), worker="w", lease=60, order_by=[Window(RowNumber(), order_by="pk")])
    assert len(queries) == 0
