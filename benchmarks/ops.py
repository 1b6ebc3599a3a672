"""The operations each benchmark process runs in a loop: hand-written Django code and its lockkit equivalent.

Every builder takes ``(rng, worker)`` and returns an ``Op``: a callable doing one operation and returning how many
units (reservations, orders, jobs) it completed. Imported only after ``django.setup()``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

import lockkit
from benchmarks.models import Item, Job
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit.claims import claim_next, complete, complete_many

Op = Callable[[], int]
Builder = Callable[[random.Random, int], Op]

ROWS = 1000  # workload 1: uncontended rows
HOT = 1  # workloads 2 and 4: the hot row
ORDER_ROWS = 10  # workload 3: orders pick ORDER_SIZE distinct rows among the first ORDER_ROWS
ORDER_SIZE = 3
BATCH = 20  # workload 5: jobs per batched claim
LEASE = 60.0

#: Per process: retries and deadlocks seen by lockkit's retry hook.
counters: Counter[str] = Counter()


def _count_retry(event: RetryEvent) -> None:
    counters["retries"] += 1
    if event.failure is Failure.DEADLOCK_DETECTED:
        counters["deadlocks"] += 1


# Both order implementations retry the same way, so the only difference between them is the locking order.
ORDER_RETRY = RetryPolicy(attempts=50, before_retry=_count_retry)


# -- one reservation: the hand-written idiom and lockkit -----------------------------------------------------------


def reserve_hand(pk: int) -> None:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '5s'")
        item = Item.objects.select_for_update(of=("self",)).get(pk=pk)
        item.available -= 1
        item.reserved += 1
        item.save(update_fields=["available", "reserved"])


@lockkit.locked_operation(lock_timeout=5)
def reserve_lockkit(pk: int) -> None:
    item = lockkit.current_scope().get(Item, pk=pk)
    item.available -= 1
    item.reserved += 1
    item.save(update_fields=["available", "reserved"])


def reserve_lockkit_scope(pk: int) -> None:
    """lockkit without the retrying decorator: the ``locked()`` context manager (no tenacity on the path)."""
    with lockkit.locked(lock_timeout=5) as scope:
        item = scope.get(Item, pk=pk)
        item.available -= 1
        item.reserved += 1
        item.save(update_fields=["available", "reserved"])


def _reserve_one(item: Item) -> dict[str, int]:
    """``locked_update``'s decision: one unit from ``available`` to ``reserved``, or refuse when none is left."""
    if item.available < 1:
        raise RuntimeError(f"item {item.pk} ran out of stock")
    return {"available": item.available - 1, "reserved": item.reserved + 1}


def reserve_locked_update(pk: int) -> None:
    """``lockkit.locked_update``: the opening with the locking ``SELECT``, then ``UPDATE ...; COMMIT`` (2 messages)."""
    lockkit.locked_update(Item.objects.filter(pk=pk), _reserve_one, lock_timeout=5)


def reserve_guarded_update(pk: int) -> None:
    """``lockkit.guarded_update``: ``BEGIN; set_config; UPDATE ... WHERE available >= 1 RETURNING; COMMIT``, one
    message (the lock timeout is the project's setting, 5 s)."""
    rows = lockkit.guarded_update(
        Item.objects.filter(pk=pk, available__gte=1),
        available=F("available") - 1,
        reserved=F("reserved") + 1,
    )
    if not rows:
        raise RuntimeError(f"item {pk} ran out of stock")


def decrement_guarded(pk: int) -> None:
    """The single-statement alternative: a guarded ``UPDATE`` in autocommit, no row read, no explicit lock."""
    Item.objects.filter(pk=pk, available__gte=1).update(
        available=F("available") - 1, reserved=F("reserved") + 1
    )


# -- orders: several rows with overlapping keys ------------------------------------------------------------------


def _take(items: list[Item]) -> None:
    for item in items:
        item.available -= 1
        item.reserved += 1
        item.save(update_fields=["available", "reserved"])


def order_hand_sorted(pks: list[int]) -> None:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '5s'")
        _take(list(Item.objects.select_for_update(of=("self",)).filter(pk__in=pks).order_by("pk")))


@lockkit.locked_operation(lock_timeout=5, retry=ORDER_RETRY)
def order_lock_all(pks: list[int]) -> None:
    _take(lockkit.current_scope().lock_all(Item, pks=pks))


@lockkit.locked_operation(lock_timeout=5, retry=ORDER_RETRY)
def order_unordered(pks: list[int]) -> None:
    scope = lockkit.current_scope()
    _take([scope.get(Item, pk=pk) for pk in pks])


# -- builders ----------------------------------------------------------------------------------------------------


def _uncontended(func: Callable[[int], None]) -> Builder:
    def build(rng: random.Random, worker: int) -> Op:
        def op() -> int:
            func(rng.randint(1, ROWS))
            return 1

        return op

    return build


def _hot(func: Callable[[int], None]) -> Builder:
    def build(rng: random.Random, worker: int) -> Op:
        def op() -> int:
            func(HOT)
            return 1

        return op

    return build


def _orders(func: Callable[[list[int]], None]) -> Builder:
    def build(rng: random.Random, worker: int) -> Op:
        rows = range(1, ORDER_ROWS + 1)

        def op() -> int:
            func(rng.sample(rows, ORDER_SIZE))  # distinct rows in random order
            return 1

        return op

    return build


def _claims(limit: int) -> Builder:
    def build(rng: random.Random, worker: int) -> Op:
        pending = Job.objects.filter(state="pending")
        name = f"bench-{worker}"

        def op() -> int:
            taken = claim_next(pending, worker=name, lease=LEASE, limit=limit, set={"state": "running"})
            if not taken:
                counters["empty"] += 1
                return 0
            if limit == 1:
                complete(taken[0], set={"state": "done"})
            else:
                complete_many(taken, set={"state": "done"})
            return len(taken)

        return op

    return build


def claim_hand(name: str) -> int:
    """The hand-written claim loop lockkit's claims replace: lock one free job skipping locked rows, mark it claimed
    with a fencing token and a lease, commit; then complete it with a guarded ``UPDATE`` (five round trips)."""
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(state="pending", lease_expires_at__isnull=True)
            .order_by("pk")
            .first()
        )
        if job is None:
            return 0
        now = timezone.now()
        job.state = "running"
        job.claimed_by = name
        job.claim_token += 1
        job.claimed_at = now
        job.lease_expires_at = now + timedelta(seconds=LEASE)
        job.attempts += 1
        job.save(
            update_fields=["state", "claimed_by", "claim_token", "claimed_at", "lease_expires_at", "attempts"]
        )
    done = Job.objects.filter(pk=job.pk, claim_token=job.claim_token, lease_expires_at__isnull=False).update(
        state="done", lease_expires_at=None
    )
    if done != 1:
        raise RuntimeError(f"job {job.pk} was taken over before completion")
    return 1


def _hand_claims(rng: random.Random, worker: int) -> Op:
    name = f"hand-{worker}"

    def op() -> int:
        units = claim_hand(name)
        if not units:
            counters["empty"] += 1
        return units

    return op


BUILDERS: dict[str, Builder] = {
    "reserve_hand": _uncontended(reserve_hand),
    "reserve_lockkit": _uncontended(reserve_lockkit),
    "hot_hand": _hot(reserve_hand),
    "hot_lockkit": _hot(reserve_lockkit),
    "hot_guarded": _hot(decrement_guarded),
    "reserve_locked_update": _uncontended(reserve_locked_update),
    "reserve_guarded_update": _uncontended(reserve_guarded_update),
    "hot_locked_update": _hot(reserve_locked_update),
    "hot_guarded_update": _hot(reserve_guarded_update),
    "reserve_lockkit_scope": _uncontended(reserve_lockkit_scope),
    "order_hand_sorted": _orders(order_hand_sorted),
    "order_lock_all": _orders(order_lock_all),
    "order_unordered": _orders(order_unordered),
    "claim_one": _claims(1),
    "claim_batch": _claims(BATCH),
    "claim_hand": _hand_claims,
}


#: Operations on APIs an older lockkit lacks: the attribute each needs (``missing()`` names them).
_NEEDS: dict[str, tuple[object, str]] = {
    "reserve_locked_update": (lockkit, "locked_update"),
    "hot_locked_update": (lockkit, "locked_update"),
    "reserve_guarded_update": (lockkit, "guarded_update"),
    "hot_guarded_update": (lockkit, "guarded_update"),
}


def missing(name: str) -> str | None:
    """What operation ``name`` needs that this lockkit does not have, or ``None`` when it can run."""
    owner, attribute = _NEEDS.get(name, (None, ""))
    if owner is None or hasattr(owner, attribute):
        return None
    return f"this lockkit has no {getattr(owner, '__name__', owner)}.{attribute}"


def build(name: str, rng: random.Random, worker: int) -> Op:
    return BUILDERS[name](rng, worker)
