"""One soak worker process: places orders and works jobs with the sample's services, logging every outcome.

The loop has no recovery code of its own (no ``close_old_connections()``, no reconnects, no retries): lockkit
must leave the connection usable. Each outcome the services acknowledged is appended to the worker's log and
fsync'd before the next operation starts, so the log survives a SIGKILL; the parent reconciles the logs
against the database at the end.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from typing import IO, Any

from lockkit_harness.soak.plan import PLENTIFUL, SCARCE

SETTINGS_MODULE = "lockkit_harness.soak.settings"
RECLAIM_EVERY = 2.0  # seconds between two reclaim_expired() calls of one worker
LEAK_CHECK_EVERY = 250  # operations between two checks that no timeout leaked onto the session
MAX_ATTEMPTS = 50  # a job is failed after this many claims: never reached unless something is wrong


@dataclass
class Shared:
    """What the parent and the workers share: per-worker last progress time and operation count, and events."""

    progress: Any  # multiprocessing Array of doubles (time.time() of the last *successful* operation)
    operations: Any  # multiprocessing Array of ints
    stop: Any  # Event: finish the current operation and exit
    drain: Any  # Event: faults are over; work jobs until none is left, then exit


class Log:
    """An append-only, fsync'd JSON-lines log of acknowledged outcomes."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the worker

    def write(self, **record: Any) -> None:
        record = {"t": round(time.time(), 6), **record}  # wall-clock seconds: logs line up with each other
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())


def _setup(url: str) -> None:
    os.environ["SAMPLE_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    import django

    django.setup()


MUTATIONS = ("keep-dead-connections",)


def _mutate(mutation: str | None) -> None:
    """Put a known defect into this worker process, for the soak's own test (the soak must then fail).

    ``keep-dead-connections``: a dead connection is never discarded, neither by lockkit (its liveness checks made
    no-ops) nor by Django (its wrapper's ``close()`` does nothing once the driver connection is broken): the bug
    of lockkit's turn 2, with Django's own safety net removed so that it shows under every workload. Test tooling
    only: nothing shipped does this.
    """
    if mutation is None:
        return
    if mutation not in MUTATIONS:
        raise ValueError(f"mutation must be one of {MUTATIONS}, got {mutation!r}")
    from django.db.backends.base.base import BaseDatabaseWrapper

    import lockkit._engine.transaction
    import lockkit.claims.runner

    def keep(alias: str) -> None:
        return None

    for module in (lockkit._engine.transaction, lockkit.claims.runner):
        module.discard_if_dead = keep  # type: ignore[attr-defined]
        module.discard_after_loss = keep  # type: ignore[attr-defined]
    close = BaseDatabaseWrapper.close

    def close_unless_dead(self: BaseDatabaseWrapper) -> None:
        driver: Any = self.connection
        if driver is not None and (getattr(driver, "broken", False) or getattr(driver, "closed", False)):
            return
        close(self)

    BaseDatabaseWrapper.close = close_unless_dead  # type: ignore[method-assign]


def run_worker(
    index: int,
    incarnation: int,
    url: str,
    log_path: str,
    seed: int,
    lease: float,
    shared: Shared,
    mutation: str | None = None,
) -> None:
    """The worker's main loop (the target of a spawned process)."""
    _setup(url)
    _mutate(mutation)
    from lockkit import CommitOutcomeUnknown
    from lockkit.claims import held_by
    from lockkit_harness.soak import services
    from lockkit_harness.soak.services import place_order
    from sample_project.inventory.errors import InsufficientStock
    from sample_project.jobs.models import Job
    from sample_project.jobs.services import (
        claim_next_job,
        complete_job,
        enqueue,
        heartbeat_job,
        reclaim_expired_jobs,
    )

    log = Log(log_path)
    rng = random.Random(seed * 1000 + index * 100 + incarnation)
    worker = f"w{index}"
    skus = list(SCARCE) * 3 + list(PLENTIFUL)
    sequence = 0
    last_reclaim = 0.0
    log.write(kind="start", worker=worker, incarnation=incarnation, pid=os.getpid())

    def tick(succeeded: bool) -> None:
        """Count an operation; only a successful one (a truthful answer from the services) is progress."""
        if succeeded:
            shared.progress[index] = time.time()
        shared.operations[index] += 1

    services.on_delivered = lambda ref: log.write(kind="delivered", ref=ref)

    def order() -> bool:
        nonlocal sequence
        sequence += 1
        ref = f"{worker}.{incarnation}.{sequence}"
        sku, quantity = rng.choice(skus), rng.randint(1, 3)
        try:
            place_order(ref, sku, quantity)
            log.write(kind="order", ref=ref, sku=sku, qty=quantity, r="ok")
        except InsufficientStock:
            log.write(kind="order", ref=ref, sku=sku, qty=quantity, r="refused")
        except CommitOutcomeUnknown:
            log.write(kind="order", ref=ref, sku=sku, qty=quantity, r="unknown")
            return False
        except Exception as exc:  # every other error: the service said it did not happen
            log.write(kind="order", ref=ref, sku=sku, qty=quantity, r="failed", e=type(exc).__name__)
            return False
        return True

    def work(claim: Any) -> bool | None:
        """Work one claimed job: a little time, a heartbeat, the completion.

        Returns whether it was done (a stale claim is a truthful answer too), ``None`` when the step failed.
        """
        time.sleep(rng.uniform(0.0, 0.01))
        try:
            if not heartbeat_job(claim, lease=lease):
                log.write(kind="job", job=claim.pk, token=claim.token, r="stale")
                return False
            done = complete_job(claim, result={"worker": worker})
            log.write(kind="job", job=claim.pk, token=claim.token, r="done" if done else "stale")
            return done
        except CommitOutcomeUnknown:
            log.write(kind="job", job=claim.pk, token=claim.token, r="unknown")
        except Exception as exc:
            log.write(kind="job", job=claim.pk, token=claim.token, r="failed", e=type(exc).__name__)
        return None

    def orphans() -> None:
        """Finish the jobs this worker still holds (a killed predecessor's, or a claim whose reply was lost)."""
        try:
            for claim in held_by(Job.objects.filter(state=Job.State.RUNNING), worker=worker):
                work(claim)
        except Exception as exc:
            log.write(kind="held_by", r="failed", e=type(exc).__name__)

    def job_step() -> tuple[bool, bool]:
        """Claim and work one job; returns whether there was one, and whether the step succeeded."""
        nonlocal last_reclaim
        now = time.monotonic()
        if now - last_reclaim > RECLAIM_EVERY:
            last_reclaim = now
            try:
                reclaim_expired_jobs(max_attempts=MAX_ATTEMPTS)
            except Exception as exc:
                log.write(kind="reclaim", r="failed", e=type(exc).__name__)
        try:
            claim = claim_next_job(worker, lease=lease)
        except CommitOutcomeUnknown:
            log.write(kind="claim", r="unknown")
            orphans()
            return True, False
        except Exception as exc:
            log.write(kind="claim", r="failed", e=type(exc).__name__)
            return True, False
        if claim is None:
            return False, True
        return True, work(claim) is not None

    def enqueue_step() -> bool:
        try:
            job = enqueue("soak", {"by": worker})
            log.write(kind="enqueue", job=job.pk, r="ok")
            return True
        except Exception as exc:
            log.write(kind="enqueue", r="failed", e=type(exc).__name__)
            return False

    def leak_check() -> None:
        from django.db import connection

        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')")
                row = cursor.fetchone()
        except Exception:
            return  # a fault hit the check itself; the next one runs on a fresh connection
        if row is not None and tuple(row) != ("0", "0"):
            log.write(kind="leak", lock_timeout=row[0], statement_timeout=row[1])

    orphans()
    while not shared.stop.is_set():
        if shared.drain.is_set():
            found, succeeded = job_step()
            if not found:
                try:
                    if not Job.objects.filter(state__in=[Job.State.PENDING, Job.State.RUNNING]).exists():
                        break
                except Exception as exc:
                    log.write(kind="drain", r="failed", e=type(exc).__name__)
                    succeeded = False
                time.sleep(0.05)
            tick(succeeded)
            continue
        roll = rng.random()
        if roll < 0.75:
            succeeded = order()
        elif roll < 0.85:
            succeeded = enqueue_step()
        else:
            succeeded = job_step()[1]
        tick(succeeded)
        if shared.operations[index] % LEAK_CHECK_EVERY == 0:
            leak_check()
    leak_check()
    log.write(kind="exit", worker=worker, incarnation=incarnation)
    from django.db import connections

    connections.close_all()
