"""What ``StaleClaim`` says happened to the row: completed by a later claim, now claimed by another worker (with its
token), ended by this very claim, expired, or deleted; never "held by None". On PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

from typing import Any

import pytest

from lockkit.claims import (
    Claim,
    StaleClaim,
    claim,
    complete,
    complete_many,
    fenced,
    heartbeat,
    reclaim_expired,
    release,
)
from lockkit_tests.models import Job
from lockkit_tests.support.claims_vendors import claims_vendor_params, expire

VENDORS = claims_vendor_params()
ENDED = "was completed or released (or handed back by reclaim_expired)"


def _handed_over(alias: str, name: str = "job") -> tuple[Job, Claim, Claim]:
    """A job claimed by worker a, whose lease expired and was reclaimed, then claimed by worker b."""
    job = Job.objects.using(alias).create(name=name)
    first = claim(job, worker="a", lease=60, using=alias)
    assert first is not None
    expire(alias, job.pk)
    assert reclaim_expired(Job.objects.using(alias), set={"state": "pending"}) == 1
    second = claim(job, worker="b", lease=60, using=alias)
    assert second is not None
    assert second.token != first.token
    return job, first, second


def _message(call: Any, *args: Any, **kwargs: Any) -> StaleClaim:
    with pytest.raises(StaleClaim) as caught:
        call(*args, **kwargs)
    return caught.value


def _fenced(held: Claim) -> None:
    with fenced(held):
        pytest.fail("the block must not run")


@pytest.mark.parametrize("alias", VENDORS)
def test_a_job_another_worker_completed(alias: str) -> None:
    job, first, second = _handed_over(alias)
    complete(second, set={"state": "done"})
    error = _message(complete, first, set={"state": "done"})
    assert str(error) == (
        f"1 of 1 Job claim(s) no longer hold their row: pk={job.pk!r} token={first.token} worker='a': it is no "
        f"longer claimed by anyone: the later claim of worker 'b' with token {second.token} {ENDED}; nothing was "
        "written"
    )
    assert "None" not in str(error)
    assert error.holders == {job.pk: None}
    assert not error.already_done
    assert str(_message(_fenced, first)) == (
        f"Job claim pk={job.pk!r} token={first.token} worker='a' is no longer current: it is no longer claimed by "
        f"anyone: the later claim of worker 'b' with token {second.token} {ENDED}; nothing was written"
    )


@pytest.mark.parametrize("alias", VENDORS)
def test_a_job_another_worker_holds_now(alias: str) -> None:
    job, first, second = _handed_over(alias)
    error = _message(release, first)
    assert str(error) == (
        f"1 of 1 Job claim(s) no longer hold their row: pk={job.pk!r} token={first.token} worker='a': it is now "
        f"claimed by worker 'b' with token {second.token}; nothing was written"
    )
    assert error.holders == {job.pk: ("b", second.token)}
    assert str(_message(heartbeat, first, lease=60)) == str(error)
    assert str(_message(_fenced, first)) == (
        f"Job claim pk={job.pk!r} token={first.token} worker='a' is no longer current: it is now claimed by "
        f"worker 'b' with token {second.token}; nothing was written"
    )
    expire(alias, job.pk)  # b's lease ran out, and nobody reclaimed it yet
    assert str(_message(_fenced, first)).endswith(
        f"it is now claimed by worker 'b' with token {second.token}, whose lease has expired; nothing was written"
    )
    assert str(_message(_fenced, second)) == (
        f"Job claim pk={job.pk!r} token={second.token} worker='b' is no longer current: its lease expired by the "
        "database clock; nothing was written"
    )


@pytest.mark.parametrize("alias", VENDORS)
def test_a_claim_ended_by_itself_and_a_deleted_row(alias: str) -> None:
    done = Job.objects.using(alias).create(name="done")
    gone = Job.objects.using(alias).create(name="gone")
    ended, deleted = claim(done, worker="a", lease=60), claim(gone, worker="a", lease=60)
    assert ended is not None
    assert deleted is not None
    complete(ended, set={"state": "done"})
    Job.objects.using(alias).filter(pk=gone.pk).delete()
    error = _message(complete_many, [ended, deleted], set={"state": "failed"})
    assert str(error) == (
        f"2 of 2 Job claim(s) no longer hold their row: pk={done.pk!r} token={ended.token} worker='a': it is no "
        f"longer claimed by anyone: this claim {ENDED}; pk={gone.pk!r} token={deleted.token} worker='a': the row "
        "no longer exists; nothing was written"
    )
    assert error.holders == {done.pk: None, gone.pk: None}
    assert str(_message(_fenced, deleted)).endswith(
        "is no longer current: the row no longer exists; nothing was written"
    )
