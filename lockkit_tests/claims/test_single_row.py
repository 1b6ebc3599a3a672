"""One job at a time, in the cheaper statements: ``claim_next(limit=1)`` and the fence of a single claim.

``claim_next(limit=1)`` sends ``UPDATE ... WHERE pk = (SELECT ... LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED)`` (an
uncorrelated scalar subquery: PostgreSQL runs it once), and ending or renewing one claim sends a guarded
``UPDATE ... WHERE pk = %s AND claim_token = %s AND claimed_by = %s AND lease_expires_at IS NOT NULL``. Both must
keep the semantics of the general statements: exactly one row per claim under contention, the candidates' order,
nothing written for a stale claim. The claims runner decorates its operation once per alias, lock timeout and call
site; settings and argument checks must still apply per call.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import ProgrammingError, connection, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from lockkit.claims import StaleClaim, claim_next, complete, heartbeat, release
from lockkit.testing import hold_lock, in_thread, wait_until_blocked
from lockkit_harness.proxy import FaultProxy
from lockkit_tests.claims.test_hardening import queue_schema  # noqa: F401  # the fixture, used by name
from lockkit_tests.models import Job, QueuedJob
from lockkit_tests.support.util import run_threads

pytestmark = pytest.mark.django_db(transaction=True)


def _claiming(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "claimed_by" in q["sql"]]


def test_limit_one_claims_the_first_free_row_in_order_with_one_scalar_subquery() -> None:
    Job.objects.bulk_create([Job(name=name) for name in ("a-low", "c-high", "b-mid")])
    with CaptureQueriesContext(connection) as queries:
        (made,) = claim_next(Job.objects.order_by("-name"), worker="w", lease=30)
    (statement,) = _claiming(queries)
    assert "WHERE" in statement
    assert "= (SELECT" in statement
    assert "SKIP LOCKED" in statement
    assert "MATERIALIZED" not in statement
    assert Job.objects.get(pk=made.pk).name == "c-high"
    assert (made.token, made.worker, made.attempt) == (1, "w", 1)
    # The next call skips the claimed row (lease_expires_at is set) and takes the next in order.
    (second,) = claim_next(Job.objects.order_by("-name"), worker="w", lease=30)
    assert Job.objects.get(pk=second.pk).name == "b-mid"


def test_limit_one_skips_a_locked_row_and_claims_nothing_when_all_are_held() -> None:
    first, second = Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    with hold_lock(Job.objects.filter(pk=first.pk), timeout=10):
        (made,) = claim_next(Job.objects.order_by("pk"), worker="w", lease=30)
        assert made.pk == second.pk
        assert claim_next(Job.objects.order_by("pk"), worker="w2", lease=30) == []
    assert Job.objects.get(pk=first.pk).claim_token == 0


def test_limit_one_under_contention_claims_each_row_exactly_once() -> None:
    Job.objects.bulk_create([Job(name=f"j{i}") for i in range(60)])
    barrier = threading.Barrier(4, timeout=30)
    taken: list[list[Any]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait()
            while True:
                made = claim_next(Job.objects.all(), worker=f"w{index}", lease=30)
                if not made:
                    return
                taken[index].append(made[0].pk)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(worker, 4)
    assert errors == []
    every = [pk for worker_taken in taken for pk in worker_taken]
    assert sorted(every) == sorted(Job.objects.values_list("pk", flat=True))  # each row once, none missed
    assert set(Job.objects.values_list("claim_token", flat=True)) == {1}


def test_one_claim_is_ended_by_a_guarded_update_and_a_stale_one_writes_nothing() -> None:
    Job.objects.create(name="a")
    (made,) = claim_next(Job.objects.all(), worker="w", lease=30)
    # Another worker took the row over (a reclaim and a new claim): the old claim is stale.
    Job.objects.filter(pk=made.pk).update(claim_token=made.token + 1, claimed_by="other")
    with CaptureQueriesContext(connection) as queries, pytest.raises(StaleClaim):
        complete(made, set={"state": "done"})
    fence = [q["sql"] for q in queries.captured_queries if '"state" = ' in q["sql"]]
    assert fence
    assert all(sql.removesuffix("; COMMIT").split("; ")[-1].startswith("UPDATE ") for sql in fence)
    row = Job.objects.get(pk=made.pk)
    assert (row.state, row.claimed_by, row.lease_expires_at is not None) == ("pending", "other", True)


def test_one_claim_renewed_then_released_through_the_guarded_update() -> None:
    Job.objects.create(name="a")
    (made,) = claim_next(Job.objects.all(), worker="w", lease=30)
    renewed = heartbeat(made, lease=120)
    row = Job.objects.get(pk=made.pk)
    assert renewed.lease_expires_at == row.lease_expires_at
    assert renewed.lease_expires_at is not None
    assert made.lease_expires_at is not None
    assert (renewed.lease_expires_at - made.lease_expires_at).total_seconds() > 80
    release(renewed, set={"state": "pending"})
    row = Job.objects.get(pk=made.pk)
    assert (row.lease_expires_at, row.claim_token) == (None, 1)
    with pytest.raises(StaleClaim):  # ended: the fence no longer matches
        complete(renewed)


def test_the_claims_operation_is_decorated_once_but_checks_every_call() -> None:
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    claim_next(Job.objects.all(), worker="w", lease=30, lock_timeout=1)
    # True == 1 and hashes alike: a kept operation for lock_timeout=1 must not let a bool through.
    with pytest.raises(TypeError, match="lock_timeout"):
        claim_next(Job.objects.all(), worker="w", lease=30, lock_timeout=True)
    with pytest.raises(TypeError, match="lock_timeout"):
        claim_next(Job.objects.all(), worker="w", lease=30, lock_timeout=[1])  # type: ignore[call-overload]  # unhashable: still refused
    assert Job.objects.filter(claim_token=1).count() == 1


def test_the_kept_claims_operation_reads_the_lock_timeout_setting_per_call() -> None:
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    sent = []
    for seconds in (2, 3):
        with (
            override_settings(LOCKKIT={"LOCK_TIMEOUT": seconds}),
            CaptureQueriesContext(connection) as queries,
        ):
            claim_next(Job.objects.all(), worker="w", lease=30)
        sent.append(_claiming(queries)[0])
    assert "set_config('lock_timeout', '2000ms', true)" in sent[0]
    assert "set_config('lock_timeout', '3000ms', true)" in sent[1]


@pytest.mark.parametrize("pk", [-(2**63), -1, 2**63 - 1])
def test_one_claim_with_an_extreme_primary_key_is_ended_renewed_and_released(pk: int) -> None:
    # Bound client-side, a negative key is written `-9223372036854775808`; `::bigint` must not bind before the minus.
    Job.objects.create(pk=pk, name="edge")
    (made,) = claim_next(Job.objects.filter(pk=pk), worker="w", lease=30)
    renewed = heartbeat(made, lease=60)
    release(renewed)
    (again,) = claim_next(Job.objects.filter(pk=pk), worker="w", lease=30)
    complete(again, set={"state": "done"})
    row = Job.objects.get(pk=pk)
    assert (row.state, row.claim_token, row.lease_expires_at) == ("done", 2, None)


@pytest.mark.usefixtures("queue_schema")
def test_limit_one_on_a_schema_qualified_table_never_claims_more_than_one_row() -> None:
    # There the SELECT names the table by an alias; SQL naming the table itself must not correlate a scalar
    # subquery with the outer UPDATE (which claimed every matching row): the CTE form refuses it instead.
    for _ in range(4):
        QueuedJob.objects.create(state="x")
    table = connection.ops.quote_name(QueuedJob._meta.db_table)
    candidates = QueuedJob.objects.extra(where=[f'{table}."state" = %s'], params=["x"]).order_by("pk")
    with pytest.raises(ProgrammingError):
        claim_next(candidates, worker="w", lease=30)
    assert QueuedJob.objects.filter(claim_token__gt=0).count() == 0
    # Plain filters claim one row at a time there.
    (made,) = claim_next(QueuedJob.objects.filter(state="x").order_by("pk"), worker="w", lease=30)
    assert QueuedJob.objects.filter(claim_token__gt=0).count() == 1
    assert made.pk == QueuedJob.objects.order_by("pk").values_list("pk", flat=True)[0]


# -- faults on the one-claim statements: the next call in the same process must work --------------------------


@pytest.mark.django_db(transaction=True, databases=["default", "proxied"])
def test_a_lost_commit_reply_of_a_one_claim_completion_is_resolved_and_the_next_call_works(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    (made,) = claim_next(Job.objects.using(alias).order_by("pk"), worker="w", lease=30)
    proxy.arm("deliver")  # the server commits the guarded UPDATE; its reply to COMMIT is cut
    complete(made, set={"state": "done"})  # resolved as committed: no error, no second write
    assert proxy.cuts["deliver"] == 1
    row = Job.objects.get(pk=made.pk)
    assert (row.state, row.lease_expires_at, row.claim_token) == ("done", None, 1)
    # The next call, on a new connection (a completed job is free again: pick the pending one).
    (second,) = claim_next(Job.objects.using(alias).filter(state="pending"), worker="w", lease=30)
    complete(second, set={"state": "done"})
    assert list(Job.objects.order_by("pk").values_list("state", flat=True)) == ["done", "done"]


def test_a_session_terminated_while_a_completion_waits_is_retried_and_the_next_call_works() -> None:
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    (made,) = claim_next(Job.objects.order_by("pk"), worker="w", lease=30)
    with hold_lock(Job.objects.filter(pk=made.pk), timeout=20) as holder:
        worker = in_thread(complete, made, set={"state": "done"})
        (waiting,) = wait_until_blocked(holder, contenders=worker)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [waiting])
        holder.release()
        # ConnectionLost before COMMIT: nothing was written, the call is retried on a new connection.
        assert worker.result(timeout=20) is None
    row = Job.objects.get(pk=made.pk)
    assert (row.state, row.lease_expires_at) == ("done", None)
    (second,) = claim_next(Job.objects.filter(state="pending"), worker="w", lease=30)
    release(second)
    assert Job.objects.get(pk=second.pk).lease_expires_at is None
