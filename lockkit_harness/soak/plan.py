"""The soak's options, and its fault schedule: drawn from a seed before the run starts, and printed."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

FAULT_KINDS = (
    "kill_worker",  # SIGKILL of a worker process (restarted at once)
    "terminate_session",  # pg_terminate_backend of a random worker session
    "cancel_statement",  # pg_cancel_backend of a random active statement
    "restart_server",  # pg_ctl restart -m fast
    "cut_commit_committed",  # the proxy forwards a COMMIT, the server commits, the reply is dropped
    "cut_commit_aborted",  # the proxy swallows a COMMIT and hangs up: the server rolls back
)

# Stock: a few scarce SKUs that sell out (the oversell invariant has teeth) and plentiful ones that keep selling.
SCARCE = {f"scarce-{n}": 400 for n in range(4)}
PLENTIFUL = {f"plenty-{n}": 10_000_000 for n in range(6)}


@dataclass(frozen=True)
class SoakOptions:
    """How long and how hard to soak.

    Attributes:
        duration: Seconds of load (faults in the middle part), before the drain.
        workers: Worker processes (the issue asks for at least 8).
        proxied: How many of them reach the server through the COMMIT-cutting proxy.
        fault_every: Mean seconds between two faults.
        seed: The random seed of the schedule and of the workers' choices.
        log_dir: Where the per-worker logs go (a temporary directory when ``None``).
        lease: Seconds of a job claim's lease.
        database_url: A PostgreSQL database to soak instead of a throwaway cluster (its ``public`` schema is
            dropped and recreated); the server is not the soak's to restart, so ``restart_server`` is left out.
        mutation: A deliberate defect to put into the workers' lockkit (the soak's own test: it must then fail):
            ``"keep-dead-connections"`` never discards a dead connection.
    """

    duration: float = 120.0
    workers: int = 8
    proxied: int = 3
    fault_every: float = 2.0
    seed: int = 11
    log_dir: Path | None = None
    lease: float = 10.0
    database_url: str | None = None
    mutation: str | None = None

    @property
    def fault_kinds(self) -> tuple[str, ...]:
        """The kinds this run can inject (no server restart on a server that is not the soak's own)."""
        return tuple(k for k in FAULT_KINDS if not (self.database_url and k == "restart_server"))

    @property
    def warmup(self) -> float:
        """Seconds of load before the first fault."""
        return max(5.0, self.duration * 0.1)

    @property
    def cooldown(self) -> float:
        """Seconds of load after the last fault."""
        return max(8.0, self.duration * 0.15)


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: when (seconds from the start), what, and a per-fault random number."""

    at: float
    kind: str
    pick: int


def schedule(options: SoakOptions) -> list[Fault]:
    """Draw the fault schedule: every kind at least once, then random kinds at random (exponential) gaps."""
    rng = random.Random(options.seed)
    start, end = options.warmup, options.duration - options.cooldown
    faults: list[Fault] = []
    at = start
    kinds = list(options.fault_kinds)
    rng.shuffle(kinds)
    while True:
        at += rng.expovariate(1.0 / options.fault_every)
        if at >= end:
            break
        kind = kinds.pop() if kinds else rng.choice(options.fault_kinds)
        faults.append(Fault(round(at, 2), kind, rng.randrange(1_000_000)))
    return faults
