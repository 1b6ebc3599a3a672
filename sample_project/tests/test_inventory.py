"""reserve_stock (locked_update), the guarded and hand-written reservations, reserve_order, on real PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import transaction
from django.db.models import F, Sum

from lockkit import LockNotAvailable, RetryEvent
from lockkit.testing import hold_lock, in_thread, run_concurrently, wait_until_blocked
from sample_project.inventory.errors import InsufficientStock
from sample_project.inventory.guarded import reserve_stock_guarded
from sample_project.inventory.handwritten import reserve_stock_by_hand
from sample_project.inventory.models import Reservation, Stock
from sample_project.inventory.services import reserve_order, reserve_stock

pytestmark = pytest.mark.django_db(transaction=True)

Reserve = Callable[[str, int], int]
IMPLEMENTATIONS = [
    pytest.param(reserve_stock, id="locked"),
    pytest.param(reserve_stock_guarded, id="guarded"),
    pytest.param(reserve_stock_by_hand, id="hand"),
]


def available(sku: str) -> int:
    return Stock.objects.get(pk=sku).available


def reserved(sku: str) -> int:
    return Reservation.objects.filter(stock_id=sku).aggregate(total=Sum("quantity"))["total"] or 0


@pytest.mark.parametrize("reserve", IMPLEMENTATIONS)
def test_reserve_returns_the_remaining_quantity(reserve: Reserve, make_stock: Callable[..., None]) -> None:
    make_stock(book_1=2)
    assert reserve("book-1", 1) == 1
    assert available("book-1") == 1
    assert (
        Reservation.objects.count() == 0
    )  # a single SKU's reservation is its row: reserve_order records lines


@pytest.mark.parametrize("reserve", IMPLEMENTATIONS)
def test_insufficient_stock_changes_nothing(reserve: Reserve, make_stock: Callable[..., None]) -> None:
    make_stock(book_1=2)
    with pytest.raises(InsufficientStock) as info:
        reserve("book-1", 3)
    assert (info.value.sku, info.value.requested, info.value.available) == ("book-1", 3, 2)
    assert available("book-1") == 2


@pytest.mark.parametrize("reserve", IMPLEMENTATIONS)
def test_missing_sku_raises_does_not_exist(reserve: Reserve) -> None:
    with pytest.raises(Stock.DoesNotExist):
        reserve("nope", 1)


@pytest.mark.parametrize("reserve", IMPLEMENTATIONS)
@pytest.mark.parametrize(
    ("quantity", "error"),
    [
        (True, TypeError),
        (1.0, TypeError),
        ("1", TypeError),
        (None, TypeError),
        (0, ValueError),
        (-2, ValueError),
    ],
)
def test_bad_quantity_is_refused_before_any_sql(
    reserve: Reserve,
    quantity: object,
    error: type[Exception],
    django_assert_num_queries: Callable[..., object],
) -> None:
    with django_assert_num_queries(0), pytest.raises(error, match="quantity"):  # type: ignore[attr-defined]
        reserve("book-1", quantity)  # type: ignore[arg-type]


def test_reserve_stock_inside_atomic_commits_or_rolls_back_with_the_caller(
    make_stock: Callable[..., None],
) -> None:
    """Nested in the caller's transaction (ATOMIC_REQUESTS, the soak's order), the decrement is the caller's."""
    make_stock(book_1=2)
    left: list[int] = []

    def fail_after_reserving() -> None:
        with transaction.atomic():
            left.append(reserve_stock("book-1", 1))
            raise RuntimeError("the caller fails after the reservation")

    with pytest.raises(RuntimeError):
        fail_after_reserving()
    assert (left, available("book-1")) == ([1], 2)
    with transaction.atomic():
        assert reserve_stock("book-1", 2) == 0
    assert available("book-1") == 0


@pytest.mark.parametrize("sku", [None, 3, ""])
def test_bad_sku_is_refused(sku: object) -> None:
    with pytest.raises((TypeError, ValueError), match="sku"):
        reserve_stock(sku, 1)  # type: ignore[arg-type]


@pytest.mark.contention
@pytest.mark.parametrize("reserve", IMPLEMENTATIONS)
def test_a_waiting_reservation_decides_on_the_committed_count(
    reserve: Reserve, make_stock: Callable[..., None]
) -> None:
    """A reservation blocked behind another one that takes the last-but-one unit sees 1 left, not 2."""
    make_stock(book_1=2)
    with hold_lock(Stock.objects.filter(pk="book-1")) as holder:
        holder.run(lambda: Stock.objects.filter(pk="book-1").update(available=F("available") - 1))
        call = in_thread(reserve, "book-1", 2)
        wait_until_blocked(holder, contenders=call)
        holder.release(commit=True)
    with pytest.raises(InsufficientStock) as info:
        call.result(timeout=10)
    assert info.value.available == 1
    assert available("book-1") == 1


@pytest.mark.contention
@pytest.mark.parametrize("reserve", IMPLEMENTATIONS)
def test_concurrent_reservations_never_oversell(
    reserve: Reserve, make_stock: Callable[..., None], retries: list[RetryEvent]
) -> None:
    make_stock(hot=5)
    outcomes = run_concurrently(reserve, 8, args=("hot", 1), timeout=30)
    refused = [o for o in outcomes if isinstance(o.error, InsufficientStock)]
    others = [o.error for o in outcomes if o.error is not None and not isinstance(o.error, InsufficientStock)]
    assert others == []
    assert sorted(o.result for o in outcomes if o.result is not None) == [
        0,
        1,
        2,
        3,
        4,
    ]  # each remaining count exactly once
    assert len(refused) == 3
    assert available("hot") == 0


@pytest.mark.contention
def test_nowait_fails_fast_on_a_held_row_and_changes_nothing(make_stock: Callable[..., None]) -> None:
    make_stock(book_1=2)
    with hold_lock(Stock.objects.filter(pk="book-1")), pytest.raises(LockNotAvailable) as info:
        reserve_stock("book-1", 1, nowait=True)
    assert info.value.attempts == 1
    assert available("book-1") == 2


def test_reserve_order_takes_every_line(make_stock: Callable[..., None]) -> None:
    make_stock(a=5, b=5, c=5)
    assert reserve_order([("c", 1), ("a", 2), ("c", 2)]) == {"a": 3, "c": 2}
    assert reserve_order({"b": 5}) == {"b": 0}
    assert [available(s) for s in "abc"] == [3, 0, 2]
    assert reserved("c") == 3


def test_reserve_order_is_all_or_nothing(make_stock: Callable[..., None]) -> None:
    make_stock(a=5, b=1)
    with pytest.raises(InsufficientStock) as info:
        reserve_order([("a", 2), ("b", 2)])
    assert info.value.sku == "b"
    with pytest.raises(Stock.DoesNotExist):
        reserve_order([("a", 2), ("zzz", 1)])
    assert [available("a"), available("b")] == [5, 1]
    assert Reservation.objects.count() == 0


@pytest.mark.parametrize(
    ("lines", "error"),
    [("ab", TypeError), ([], ValueError), ([("a",)], TypeError), ([("a", 0)], ValueError), (None, TypeError)],
)
def test_reserve_order_refuses_bad_lines(lines: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        reserve_order(lines)


@pytest.mark.contention
def test_overlapping_orders_lock_in_key_order_and_never_deadlock(
    make_stock: Callable[..., None], retries: list[RetryEvent]
) -> None:
    """Orders listing {a, b} in opposite orders both queue on ``a``; neither holds ``b`` while it waits."""
    make_stock(a=10, b=10)
    with hold_lock(Stock.objects.filter(pk="a")) as holder:
        first = in_thread(reserve_order, [("b", 1), ("a", 1)])
        second = in_thread(reserve_order, [("a", 2), ("b", 2)])
        # Both wait on "a" (the second one queued behind the first waiter), the lowest key...
        wait_until_blocked(holder, count=2, contenders=[first, second])
        # ... and "b" is still free (NOWAIT would fail at once otherwise).
        with hold_lock(Stock.objects.filter(pk="b"), nowait=True):
            pass
    results = [first.result(timeout=10), second.result(timeout=10)]
    assert all(isinstance(r, dict) and set(r) == {"a", "b"} for r in results), results
    assert [available("a"), available("b")] == [7, 7]
    assert retries == []  # no deadlock was detected and retried


@pytest.mark.contention
def test_many_concurrent_overlapping_orders_keep_the_books_straight(
    make_stock: Callable[..., None], retries: list[RetryEvent]
) -> None:
    make_stock(a=100, b=100, c=100)
    orders = [
        [("a", 1), ("b", 1)],
        [("b", 1), ("c", 1)],
        [("c", 1), ("a", 1)],
        [("c", 1), ("b", 1), ("a", 1)],
    ] * 3
    outcomes = run_concurrently(reserve_order, len(orders), args=[(o,) for o in orders], timeout=60)
    assert [o.error for o in outcomes if not o.ok] == []
    assert [available(s) for s in "abc"] == [91, 91, 91]
    assert [reserved(s) for s in "abc"] == [9, 9, 9]
    assert [e.failure for e in retries] == []
