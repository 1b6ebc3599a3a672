"""The demo's explanation of the sale's throughputs: round trips counted from libpq's trace, and the note."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from sample_project.demo.flash_sale import SaleAudit, SaleResult
from sample_project.demo.report import code_of, throughput_note
from sample_project.demo.roundtrips import PROBE_SKU, RoundTrips, count_round_trips, measure
from sample_project.demo.stats import Totals
from sample_project.demo.workers import sale_implementations
from sample_project.inventory.models import Reservation, Stock


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("implementation", "per_call", "lock_held"),
    [
        # get(); save() (an autocommit UPDATE: the row locked for that one round trip); create().
        ("naive", 3, 1),
        # BEGIN; the guarded UPDATE (locks); INSERT; SELECT; COMMIT.
        ("guarded", 5, 4),
        # BEGIN with the scope's timeout in one message; SELECT ... FOR UPDATE (locks); INSERT; UPDATE + COMMIT in
        # one message (scope.save_with_commit).
        ("lockkit", 4, 3),
    ],
)
def test_round_trips_per_reservation_are_counted_from_the_trace(
    implementation: str, per_call: float, lock_held: float
) -> None:
    Stock.objects.create(sku="other", available=5)
    trips = measure(sale_implementations()[implementation], count=7)

    assert trips is not None
    assert (trips.per_call, trips.lock_held) == (per_call, lock_held)
    assert trips.ms_per_call > 0
    assert trips.cpu_ms_per_call > 0
    # The probe row and its reservations are gone; other rows are untouched.
    assert not Stock.objects.filter(sku=PROBE_SKU).exists()
    assert not Reservation.objects.filter(stock_id=PROBE_SKU).exists()
    assert list(Stock.objects.values_list("sku", "available")) == [("other", 5)]


def _ready(status: str) -> str:
    return f"B\t5\tReadyForQuery\t {status}"


def test_count_round_trips_counts_each_ready_for_query_and_the_lock_until_the_transaction_ends() -> None:
    trace = "\n".join(
        [
            'F\t10\tQuery\t "BEGIN"',
            _ready("T"),
            'F\t40\tParse\t "" "SELECT * FROM "inventory_stock" WHERE sku = $1 FOR UPDATE" 1 NNNN',
            "F\t4\tSync",
            'B\t13\tCommandComplete\t "SELECT 1"',
            _ready("T"),
            'F\t30\tQuery\t "UPDATE "inventory_stock" SET available = 1"',  # already locked: no new window
            _ready("T"),
            'F\t11\tQuery\t "COMMIT"',
            _ready("I"),
            # An autocommit write: locked for its own round trip only.
            'F\t30\tQuery\t "UPDATE inventory_stock SET available = 0"',
            _ready("I"),
            # A read outside any lock.
            'F\t13\tQuery\t "SELECT 2"',
            _ready("I"),
        ]
    )
    assert count_round_trips(trace) == (6, 3 + 1)
    assert count_round_trips("") == (0, 0)


def _result(implementation: str, operations: int, seconds: float) -> SaleResult:
    audit = SaleAudit(initial=10, remaining=5, reserved=5, oversold=0, lost_updates=0)
    return SaleResult(implementation, Totals(operations=operations, seconds=seconds), audit)


def test_the_throughput_note_explains_the_gap_from_what_was_measured() -> None:
    sales = [_result("guarded", 1000, 2.0), _result("lockkit", 1000, 2.5)]
    same = RoundTrips(per_call=5, lock_held=4, ms_per_call=2.0, cpu_ms_per_call=1.0)

    lines = throughput_note(sales, {"guarded": same, "lockkit": same}, workers=4)
    assert lines[0].startswith("Per uncontended reservation")
    assert "guarded UPDATE 5 round trips, the row locked during 4" in lines[0]
    assert lines[1].startswith("lockkit's throughput is 0.80x the guarded UPDATE's")
    assert "same 4 round trips" in lines[1]
    assert "machine's load" in lines[1]

    heavier = RoundTrips(per_call=5, lock_held=4, ms_per_call=3.0, cpu_ms_per_call=1.5)
    lines = throughput_note(sales, {"guarded": same, "lockkit": heavier}, workers=4)
    assert "lockkit spends 1.50x the guarded UPDATE's client CPU" in lines[1]

    longer = RoundTrips(per_call=6, lock_held=5, ms_per_call=2.0, cpu_ms_per_call=1.0)
    lines = throughput_note(sales, {"guarded": same, "lockkit": longer}, workers=4)
    assert "1 round trip more than the guarded UPDATE (5 vs 4)" in lines[1]

    assert throughput_note(sales, {"guarded": same, "lockkit": None}, workers=4) == [
        "(round trips not counted: libpq tracing is not available with this psycopg)"
    ]
    # Only one of the two: the measured line, no comparison.
    assert len(throughput_note(sales[1:], {"lockkit": same}, workers=4)) == 1
    assert not math.isnan(sales[0].totals.throughput)


@pytest.mark.parametrize(
    ("function", "shown"),
    [
        (sale_implementations()["guarded"], "sample_project/inventory/guarded.py:21 reserve_stock_guarded"),
        (sale_implementations()["naive"], "sample_project/inventory/naive.py:17 reserve_stock_naive"),
        (count_round_trips, "sample_project/demo/roundtrips.py:"),
    ],
)
def test_code_of_names_the_file_line_and_function(function: Callable[..., object], shown: str) -> None:
    assert code_of(function).startswith(shown)
