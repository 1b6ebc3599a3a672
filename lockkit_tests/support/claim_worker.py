"""Entry points for worker processes started with the ``spawn`` method by the claims tests.

Imported by a fresh interpreter before Django is set up, so only the function bodies import Django and models.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection


def setup_django(database_names: dict[str, str]) -> None:
    """Set Django up in a child process, on the parent's test databases (whose NAME the parent switched)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lockkit_tests.settings")
    import django
    from django.conf import settings

    django.setup()
    for alias, name in database_names.items():
        settings.DATABASES[alias]["NAME"] = name


def claim_then_hang(database_names: dict[str, str], pipe: Connection, lease: float) -> None:
    """Claim one pending job, send the ``Claim`` to the parent, then wait (at most 120 s) to be killed."""
    setup_django(database_names)
    from lockkit.claims import claim_next
    from lockkit_tests.models import Job

    claims = claim_next(
        Job.objects.filter(state="pending"), worker="doomed", lease=lease, set={"state": "running"}
    )
    pipe.send(claims)
    pipe.poll(120)  # the parent kills this process with SIGKILL long before


def run_docs_loop(database_names: dict[str, str], source: str, slot: str) -> None:
    """Run docs/claims.md's worker loop (``source``) as slot ``slot``; a job named "poison" kills the process.

    The loop's ``myapp`` imports are the sample project's ``Job``/``JobRun`` and job code that ends the process
    with ``os._exit(17)`` for the poison job, as a segfault or the OOM killer would (no cleanup, no ``finally``).
    """
    import sys
    import types

    os.environ["WORKER_SLOT"] = slot
    setup_django(database_names)
    from lockkit_tests.support.doc_examples import RetryableError
    from sample_project.jobs.models import Job, JobRun

    def compute(job: Job, should_stop: object) -> dict[str, object]:
        if job.name == "poison":
            os._exit(17)
        return {"ok": job.pk}

    def notify(job: Job, idempotency_key: str) -> None:
        pass

    modules: dict[str, dict[str, object]] = {
        "myapp": {},
        "myapp.models": {"Job": Job, "JobRun": JobRun},
        "myapp.jobs": {"RetryableError": RetryableError, "compute": compute, "notify": notify},
    }
    for name, attributes in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        sys.modules[name] = module
    namespace: dict[str, object] = {"__name__": "docs_worker"}
    exec(compile(source, "docs/claims.md", "exec"), namespace)
    work_forever = namespace["work_forever"]
    assert callable(work_forever)
    work_forever()


def claim_and_beat(database_names: dict[str, str], pipe: Connection, lease: float, every: float) -> None:
    """Claim every pending job under ``heartbeat_every``, report the claims after two beats, then wait to be killed."""
    setup_django(database_names)
    from lockkit.claims import claim_next, heartbeat_every
    from lockkit_tests.models import Job

    jobs = Job.objects.all()
    claims = claim_next(jobs.filter(state="pending"), worker="beating", lease=lease, limit=10)
    with heartbeat_every(jobs, every, worker="beating", lease=lease) as beat:
        assert beat.wait_for_beat(30)
        first = beat.last_beat
        while beat.last_beat == first:
            pipe.poll(every / 4)
        pipe.send((claims, dict(beat.held)))
        pipe.poll(120)  # the parent kills this process with SIGKILL long before
