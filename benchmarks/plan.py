"""The five workloads: which implementations run, at which process counts, and which pairs are compared."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """How long and how often each case runs."""

    rounds: int
    warmup_rounds: int
    warmup: float
    duration: float
    quick: bool


@dataclass(frozen=True)
class Impl:
    """One implementation of a workload: a Django operation (``ops.BUILDERS`` key) or a pgbench script."""

    key: str
    label: str
    op: str | None = None
    script: str | None = None


@dataclass(frozen=True)
class Workload:
    """A workload. ``pairs`` are ``(candidate, baseline)`` impl keys whose ratio is computed round by round."""

    key: str
    title: str
    impls: tuple[Impl, ...]
    procs: tuple[int, ...]
    quick_procs: tuple[int, ...]
    unit: str
    pairs: tuple[tuple[str, str], ...]
    claims: bool = False


HAND = "hand-written Django"
PGBENCH = "pgbench (same SQL, prepared)"

WORKLOADS: tuple[Workload, ...] = (
    Workload(
        key="uncontended",
        title="1. Uncontended reservations on 1,000 rows, one process",
        impls=(
            Impl("hand", HAND, op="reserve_hand"),
            Impl("lockkit", "lockkit", op="reserve_lockkit"),
            Impl("scope", "lockkit locked() context manager (no retry wrapper)", op="reserve_lockkit_scope"),
            Impl("pgbench", PGBENCH, script="reserve"),
        ),
        procs=(1,),
        quick_procs=(1,),
        unit="reservations",
        pairs=(
            ("lockkit", "hand"),
            ("scope", "hand"),
            ("lockkit", "scope"),
            ("lockkit", "pgbench"),
            ("hand", "pgbench"),
        ),
    ),
    Workload(
        key="hot",
        title="2. One hot row",
        impls=(
            Impl("hand", HAND, op="hot_hand"),
            Impl("lockkit", "lockkit", op="hot_lockkit"),
            Impl("pgbench", PGBENCH, script="hot"),
        ),
        procs=(1, 2, 4, 8),
        quick_procs=(1, 4),
        unit="reservations",
        pairs=(
            ("lockkit", "hand"),
            ("lockkit", "pgbench"),
            ("hand", "pgbench"),
        ),
    ),
    Workload(
        key="orders",
        title="3. Orders locking 3 of 10 rows, 8 processes",
        impls=(
            Impl("lock_all", "lockkit lock_all (primary-key order)", op="order_lock_all"),
            Impl("unordered", "lockkit unordered + retries", op="order_unordered"),
            Impl(
                "hand", "hand-written, ordered (select_for_update().order_by('pk'))", op="order_hand_sorted"
            ),
            Impl("pgbench", "pgbench, ordered (same SQL, prepared)", script="order_sorted"),
        ),
        procs=(8,),
        quick_procs=(8,),
        unit="orders",
        pairs=(("lock_all", "unordered"), ("lock_all", "hand"), ("lock_all", "pgbench")),
    ),
    Workload(
        key="guarded",
        title="4. Guarded single-statement decrement versus the locked path, hot row",
        impls=(
            Impl("guarded", "guarded UPDATE (Django .update(), autocommit)", op="hot_guarded"),
            Impl("lockkit", "lockkit locked path", op="hot_lockkit"),
            Impl("pgbench", "pgbench guarded UPDATE", script="hot_guarded"),
        ),
        procs=(1, 8),
        quick_procs=(8,),
        unit="decrements",
        pairs=(("guarded", "lockkit"), ("guarded", "pgbench")),
    ),
    Workload(
        key="claims",
        title="5. Job claims",
        impls=(
            Impl("claim1", "lockkit claim_next(limit=1) + complete", op="claim_one"),
            Impl(
                "claimhand",
                "hand-written claim loop (atomic + select_for_update(skip_locked) + save, guarded UPDATE)",
                op="claim_hand",
            ),
            Impl("batch", "lockkit claim_next(limit=20) + complete_many", op="claim_batch"),
            Impl("pgbench1", "pgbench claim SQL, limit 1", script="claim_one"),
            Impl("pgbench20", "pgbench claim SQL, limit 20", script="claim_batch"),
        ),
        procs=(1, 2, 4, 8),
        quick_procs=(1, 4),
        unit="jobs",
        pairs=(("claim1", "claimhand"), ("claim1", "pgbench1"), ("batch", "pgbench20")),
        claims=True,
    ),
)
