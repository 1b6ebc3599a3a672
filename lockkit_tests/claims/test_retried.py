"""A claims call is retried in a fresh transaction after a failure that rolled it back.

Under REPEATABLE READ, a claim that waited for a row another session changed and committed fails with
``serialization_failure`` (40001): the database rolled the claim's transaction back, so lockkit runs the call
again in a fresh transaction with a fresh snapshot, and the caller gets the claim.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from lockkit import Failure, signals
from lockkit.claims import Claim, claim
from lockkit.testing import hold_lock, in_thread, wait_until_blocked
from lockkit_tests.models import Job

pytestmark = [pytest.mark.contention, pytest.mark.django_db(transaction=True)]


@override_settings(LOCKKIT={"LOCK_TIMEOUT": 30})
def test_a_claim_that_lost_a_serialization_race_is_retried_in_a_fresh_transaction() -> None:
    job = Job.objects.create(name="contested")
    retried: list[dict[str, Any]] = []

    def on_retry(sender: Any, **kwargs: Any) -> None:
        retried.append(kwargs)

    def claim_under_repeatable_read() -> tuple[Claim | None, str]:
        with connections["default"].cursor() as cursor:  # this thread's own session, closed when it ends
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SHOW default_transaction_isolation")
            isolation = cursor.fetchone()[0]
        return claim(job, worker="rr", lease=30, set={"state": "running"}), isolation

    signals.operation_retried.connect(on_retry, weak=False)
    try:
        with hold_lock(Job.objects.filter(pk=job.pk)) as holder:
            holder.run(lambda: Job.objects.filter(pk=job.pk).update(name="changed while held"))
            contender = in_thread(claim_under_repeatable_read)
            assert len(wait_until_blocked(holder, count=1, timeout=20)) == 1
            holder.release(commit=True)  # the claimer's snapshot predates this commit: 40001 on its first try
        made, isolation = contender.result(timeout=60)
    finally:
        signals.operation_retried.disconnect(on_retry)
    assert isolation == "repeatable read"
    assert [(r["failure"], r["sqlstate"], r["attempt"]) for r in retried] == [
        (Failure.SERIALIZATION_FAILURE, "40001", 1)
    ]
    assert made is not None
    assert (made.pk, made.token, made.worker) == (job.pk, 1, "rr")
    row = Job.objects.get(pk=job.pk)
    assert (row.name, row.state, row.claim_token, row.claimed_by) == (
        "changed while held",
        "running",
        1,
        "rr",
    )
