"""docs/claims.md's worker loop, run in real processes: a job that kills its worker ends failed after MAX_ATTEMPTS."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
from django.db import connections

from lockkit_tests.support.claim_worker import run_docs_loop
from sample_project.jobs.models import Job, JobRun

DOCS = Path(__file__).resolve().parents[2] / "docs" / "claims.md"


def worker_loop_source() -> str:
    """The first Python block of the guide's "A worker" section: the loop users copy."""
    text = DOCS.read_text()
    section = text[text.index("\n## A worker\n") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("\n```\n", start)]


def _settled(*pks: int) -> bool:
    return not Job.objects.filter(pk__in=pks).exclude(state__in=["done", "failed"]).exists()


@pytest.mark.django_db(transaction=True)
def test_a_job_that_kills_its_worker_is_failed_after_max_attempts_and_the_next_job_runs() -> None:
    source = worker_loop_source()
    assert "MAX_ATTEMPTS = 3" in source
    poison = Job.objects.create(name="poison")
    good = Job.objects.create(name="good")
    names = {"default": connections["default"].settings_dict["NAME"]}
    context = multiprocessing.get_context("spawn")
    exits: list[int | None] = []
    for _ in range(6):  # a supervisor restarting the slot (systemd Restart=always), a bounded number of times
        process = context.Process(target=run_docs_loop, args=(names, source, "slot-1"), daemon=True)
        process.start()
        deadline = time.monotonic() + 60
        while process.is_alive() and not _settled(poison.pk, good.pk):
            assert time.monotonic() < deadline, "the worker neither died nor finished the jobs"
            process.join(0.05)
        if not process.is_alive():
            exits.append(process.exitcode)
            continue
        os.kill(process.pid or 0, signal.SIGKILL)  # both jobs settled: stop the idle loop
        process.join(10)
        break
    assert exits == [17, 17, 17]  # three attempts, each killed the worker
    poison.refresh_from_db()
    good.refresh_from_db()
    assert (poison.state, poison.attempts, poison.lease_expires_at) == ("failed", 4, None)
    assert poison.result == {"error": "gave up after 3 attempts"}
    assert (good.state, good.attempts, good.result) == ("done", 1, {"ok": good.pk})
    assert list(JobRun.objects.values_list("job_id", "token")) == [(good.pk, 1)]
    assert not JobRun.objects.filter(job=poison).exists()
