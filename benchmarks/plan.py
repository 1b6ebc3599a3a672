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
    """One implementation of a workload: a Django operation (``ops.BUILDERS`` key) or a pgbench script.

    The physical floor of a row (``benchmarks.floor``) reads three more facts: ``trips``, the round trips of one
    operation (replaced by the strace count of ``counted`` when the run has one; pgbench's scripts: one per
    command); ``held``, how many of them the hot row's lock is held across (from the locking statement's reply to
    the COMMIT's; ``None`` where no row is contended); ``server``, the pgbench script whose time per transaction,
    less its own round trips, is the server's time for this SQL.
    """

    key: str
    label: str
    op: str | None = None
    script: str | None = None
    trips: int | None = None
    counted: str | None = None
    held: int | None = None
    server: str | None = None


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
LOCKED_UPDATE = "lockkit.locked_update() (opening + SELECT ... FOR UPDATE; then UPDATE ...; COMMIT)"
GUARDED_UPDATE = "lockkit.guarded_update() (BEGIN; set_config; UPDATE ... RETURNING; COMMIT in one message)"

WORKLOADS: tuple[Workload, ...] = (
    Workload(
        key="uncontended",
        title="1. Uncontended reservations on 1,000 rows, one process",
        impls=(
            Impl("hand", HAND, op="reserve_hand", trips=5, counted="reserve_hand", server="reserve"),
            Impl(
                "lockkit",
                "lockkit, save()",
                op="reserve_lockkit",
                trips=4,
                counted="reserve_lockkit",
                server="reserve",
            ),
            Impl(
                "scope",
                "lockkit locked() context manager, save() (no retry wrapper)",
                op="reserve_lockkit_scope",
                trips=4,
                counted="reserve_lockkit_scope",
                server="reserve",
            ),
            Impl(
                "lupdate",
                LOCKED_UPDATE,
                op="reserve_locked_update",
                trips=2,
                counted="reserve_locked_update",
                server="reserve",
            ),
            Impl(
                "gupdate",
                GUARDED_UPDATE,
                op="reserve_guarded_update",
                trips=1,
                counted="reserve_guarded_update",
                server="hot_guarded",
            ),
            Impl("pgbench", PGBENCH, script="reserve", trips=5, server="reserve"),
        ),
        procs=(1,),
        quick_procs=(1,),
        unit="reservations",
        pairs=(
            ("lockkit", "hand"),
            ("scope", "hand"),
            ("lupdate", "hand"),
            ("gupdate", "hand"),
            ("lupdate", "lockkit"),
            ("lockkit", "scope"),
            ("lockkit", "pgbench"),
            ("lupdate", "pgbench"),
            ("hand", "pgbench"),
        ),
    ),
    Workload(
        key="hot",
        title="2. One hot row",
        impls=(
            Impl("hand", HAND, op="hot_hand", trips=5, counted="reserve_hand", held=2, server="hot"),
            Impl(
                "lockkit",
                "lockkit, save()",
                op="hot_lockkit",
                trips=4,
                counted="reserve_lockkit",
                held=2,
                server="hot",
            ),
            Impl(
                "lupdate",
                LOCKED_UPDATE,
                op="hot_locked_update",
                trips=2,
                counted="reserve_locked_update",
                held=1,
                server="hot",
            ),
            Impl(
                "gupdate",
                GUARDED_UPDATE,
                op="hot_guarded_update",
                trips=1,
                counted="reserve_guarded_update",
                held=0,
                server="hot_guarded",
            ),
            Impl("pgbench", PGBENCH, script="hot", trips=5, held=2, server="hot"),
        ),
        procs=(1, 2, 4, 8),
        quick_procs=(1, 4),
        unit="reservations",
        pairs=(
            ("lupdate", "hand"),
            ("gupdate", "hand"),
            ("lockkit", "hand"),
            ("lupdate", "lockkit"),
            ("lockkit", "pgbench"),
            ("lupdate", "pgbench"),
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
            Impl(
                "guarded",
                "guarded UPDATE (Django .update(), autocommit)",
                op="hot_guarded",
                trips=1,
                counted="hot_guarded",
                held=0,
                server="hot_guarded",
            ),
            Impl(
                "gupdate",
                GUARDED_UPDATE,
                op="hot_guarded_update",
                trips=1,
                counted="reserve_guarded_update",
                held=0,
                server="hot_guarded",
            ),
            Impl(
                "lupdate",
                "lockkit.locked_update() (locked path, the UPDATE with the COMMIT)",
                op="hot_locked_update",
                trips=2,
                counted="reserve_locked_update",
                held=1,
                server="hot",
            ),
            Impl(
                "lockkit",
                "lockkit locked path, save()",
                op="hot_lockkit",
                trips=4,
                counted="reserve_lockkit",
                held=2,
                server="hot",
            ),
            Impl(
                "pgbench",
                "pgbench guarded UPDATE",
                script="hot_guarded",
                trips=1,
                held=0,
                server="hot_guarded",
            ),
        ),
        procs=(1, 8),
        quick_procs=(8,),
        unit="decrements",
        pairs=(
            ("guarded", "lockkit"),
            ("gupdate", "lockkit"),
            ("gupdate", "lupdate"),
            ("gupdate", "guarded"),
            ("guarded", "pgbench"),
            ("gupdate", "pgbench"),
        ),
    ),
    Workload(
        key="claims",
        title="5. Job claims",
        impls=(
            Impl(
                "claim1",
                "lockkit claim_next(limit=1) + complete",
                op="claim_one",
                trips=2,
                counted="claim_one",
                server="claim_one",
            ),
            Impl(
                "claimhand",
                "hand-written claim loop (atomic + select_for_update(skip_locked) + save, guarded UPDATE)",
                op="claim_hand",
                trips=5,
                counted="claim_hand",
                server="claim_one",
            ),
            Impl(
                "batch",
                "lockkit claim_next(limit=20) + complete_many",
                op="claim_batch",
                trips=2,
                counted="claim_batch",
                server="claim_batch",
            ),
            Impl("pgbench1", "pgbench claim SQL, limit 1", script="claim_one", trips=2, server="claim_one"),
            Impl(
                "pgbench20",
                "pgbench claim SQL, limit 20",
                script="claim_batch",
                trips=2,
                server="claim_batch",
            ),
        ),
        procs=(1, 2, 4, 8),
        quick_procs=(1, 4),
        unit="jobs",
        pairs=(("claim1", "claimhand"), ("claim1", "pgbench1"), ("batch", "pgbench20")),
        claims=True,
    ),
)
