"""claim_job, claim_next_job, fenced completion and reclaiming, on real PostgreSQL sessions."""

from __future__ import annotations

import multiprocessing
import os
import signal
from datetime import timedelta

import pytest
from django.db import connections
from django.db.models.functions import Now

from lockkit.testing import hold_lock, in_thread, run_concurrently, wait_until_blocked
from sample_project.demo.bootstrap import url_of
from sample_project.jobs.models import Job, JobRun
from sample_project.jobs.services import (
    claim_job,
    claim_job_for,
    claim_next_job,
    claim_reported,
    complete_job,
    enqueue,
    fail_job,
    heartbeat_job,
    reclaim_expired_jobs,
)
from sample_project.tests.processes import claim_and_hang

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 10.0


def expire(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(lease_expires_at=Now() - timedelta(seconds=1))


def test_claim_job_claims_a_pending_job_once() -> None:
    job = enqueue("email")
    assert claim_job(job.pk, "w1") is True
    assert claim_job(job.pk, "w2") is False
    job.refresh_from_db()
    assert (job.state, job.claimed_by, job.claim_token, job.attempts) == ("running", "w1", 1, 1)
    assert job.claimed_at is not None
    assert job.lease_expires_at is not None


def test_claim_job_on_a_missing_job_raises_does_not_exist() -> None:
    with pytest.raises(Job.DoesNotExist):
        claim_job(12345, "w1")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((True, "w"), TypeError),
        (("1", "w"), TypeError),
        ((0, "w"), ValueError),
        ((1, ""), ValueError),
        ((1, 3), TypeError),
    ],
)
def test_claim_job_refuses_bad_arguments(args: tuple[object, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        claim_job(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lease", "error"),
    [(0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), (True, TypeError), ("5", TypeError)],
)
def test_claim_job_refuses_a_bad_lease(lease: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="lease"):
        claim_job(1, "w1", lease=lease)  # type: ignore[arg-type]


@pytest.mark.contention
def test_exactly_one_of_many_concurrent_claimers_wins() -> None:
    job = enqueue("email")
    outcomes = run_concurrently(claim_job, 8, args=[(job.pk, f"w{i}") for i in range(8)], timeout=30)
    assert [o.error for o in outcomes if not o.ok] == []
    winners = [o.index for o in outcomes if o.result is True]
    assert len(winners) == 1
    job.refresh_from_db()
    assert (job.claimed_by, job.claim_token) == (f"w{winners[0]}", 1)


@pytest.mark.contention
def test_claimers_queued_on_a_held_job_get_exactly_one_true() -> None:
    job = enqueue("email")
    with hold_lock(Job.objects.filter(pk=job.pk)) as holder:
        first = in_thread(claim_job, job.pk, "w1")
        second = in_thread(claim_job, job.pk, "w2")
        wait_until_blocked(holder, count=2, contenders=[first, second])
    assert sorted([first.result(TIMEOUT), second.result(TIMEOUT)]) == [False, True]
    job.refresh_from_db()
    assert job.claim_token == 1


@pytest.mark.contention
def test_claim_next_skips_a_job_another_worker_is_claiming() -> None:
    first, second = enqueue("a"), enqueue("b")
    with hold_lock(Job.objects.filter(pk=first.pk)):
        claim = claim_next_job("w1")  # does not wait for the held row
        assert claim is not None
        assert claim.pk == second.pk
    assert Job.objects.get(pk=first.pk).state == "pending"


@pytest.mark.contention
def test_concurrent_workers_claim_every_job_exactly_once() -> None:
    ids = {enqueue(f"job-{i}").pk for i in range(30)}

    def drain(worker: str) -> list[int]:
        claimed = []
        while (claim := claim_next_job(worker)) is not None:
            claimed.append(claim.pk)
        return claimed

    outcomes = run_concurrently(drain, 5, args=[(f"w{i}",) for i in range(5)], timeout=60)
    claimed = [job_id for o in outcomes for job_id in (o.result or [])]
    assert [o.error for o in outcomes if not o.ok] == []
    assert sorted(claimed) == sorted(ids)  # each once: no duplicates, none missed
    assert claim_next_job("late") is None


def test_completion_is_fenced_by_the_claim_token() -> None:
    job = enqueue("email")
    stale = claim_job_for(job.pk, "w1")
    assert stale is not None
    expire(job.pk)
    assert reclaim_expired_jobs() == 1
    fresh = claim_job_for(job.pk, "w2")
    assert fresh is not None
    assert fresh.token == stale.token + 1
    assert complete_job(stale) is False  # the slow first worker cannot overwrite the new owner
    assert heartbeat_job(stale) is False
    assert fail_job(stale, "late") is False
    assert complete_job(fresh, {"ok": True}) is True
    assert complete_job(fresh) is False  # already done
    job.refresh_from_db()
    assert (job.state, job.claimed_by, job.result) == ("done", "w2", {"ok": True})
    assert job.lease_expires_at is None
    assert list(JobRun.objects.values_list("worker", "token")) == [("w2", fresh.token)]


def test_reclaim_leaves_live_claims_and_fails_exhausted_jobs() -> None:
    live, exhausted = enqueue("live"), enqueue("exhausted")
    assert claim_job(live.pk, "w1")
    assert claim_job(exhausted.pk, "w2")
    Job.objects.filter(pk=exhausted.pk).update(attempts=3)
    expire(exhausted.pk)
    assert reclaim_expired_jobs(max_attempts=3) == 1
    assert Job.objects.get(pk=live.pk).state == "running"
    assert Job.objects.get(pk=exhausted.pk).state == "failed"


def test_complete_refuses_something_that_is_not_a_claim() -> None:
    with pytest.raises(TypeError, match="claim"):
        complete_job((1, "w", 1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="token"):
        claim_reported(1, "w", "1")  # type: ignore[arg-type]


@pytest.mark.contention
def test_a_killed_workers_job_is_reclaimed_after_its_lease_and_finished_once() -> None:
    job = enqueue("email")
    ctx = multiprocessing.get_context("spawn")
    claimed = ctx.Event()
    worker = ctx.Process(target=claim_and_hang, args=(url_of(connections["default"].settings_dict), claimed))
    worker.start()
    try:
        assert claimed.wait(60), "the worker never claimed the job"
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(TIMEOUT)
        assert worker.exitcode == -signal.SIGKILL
    finally:
        if worker.is_alive():
            worker.kill()
    assert Job.objects.get(pk=job.pk).claimed_by == "doomed"
    assert claim_next_job("w2") is None  # still running: its lease has not expired
    expire(job.pk)  # instead of waiting out the lease
    assert reclaim_expired_jobs() == 1
    claim = claim_next_job("w2")
    assert claim is not None
    assert (claim.pk, claim.token) == (job.pk, 2)
    assert complete_job(claim) is True
    assert list(JobRun.objects.values_list("job_id", "worker")) == [(job.pk, "w2")]
