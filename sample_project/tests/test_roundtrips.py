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
        # get(); save() (an autocommit UPDATE: the row locked for that one round trip).
        ("naive", 2, 1),
        # BEGIN; SELECT ... FOR UPDATE (locks); UPDATE; COMMIT.
        ("hand", 4, 3),
        # locked_update: BEGIN, the timeout and SELECT ... FOR UPDATE OF (locks) in one message; UPDATE + COMMIT.
        ("lockkit", 2, 2),
        # guarded_update: BEGIN, the timeout, UPDATE ... RETURNING (locks) and COMMIT in one message.
        ("guarded", 1, 1),
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


def _result(implementation: str, operations: int, seconds: float, *, oversold: int = 0) -> SaleResult:
    audit = SaleAudit(initial=10, remaining=5, reserved=5, oversold=oversold, lost_updates=oversold)
    return SaleResult(implementation, Totals(operations=operations, seconds=seconds), audit)


def _trips(held: float, cpu: float = 1.0) -> RoundTrips:
    return RoundTrips(per_call=held + 1, lock_held=held, ms_per_call=2.0, cpu_ms_per_call=cpu)


def test_the_throughput_note_says_only_what_the_figures_show() -> None:
    sales = [_result("hand", 1000, 2.0), _result("lockkit", 1000, 1.0), _result("guarded", 1000, 1.25)]
    measured = {"hand": _trips(3), "lockkit": _trips(2), "guarded": _trips(1)}

    lines = throughput_note(sales, measured, workers=4)
    assert lines[0].startswith("Per uncontended reservation")
    assert "hand-written select_for_update 4 round trips, the row locked during 3" in lines[0]
    assert "lockkit guarded_update 2 round trips" in lines[0]
    one = throughput_note(sales[:1], {"hand": RoundTrips(1, 1, 1.0, 1.0)}, workers=4)
    assert "hand-written select_for_update 1 round trip, the row locked during 1" in one[0]
    # Fewer round trips under the lock, and faster: the lock explains it.
    assert lines[1] == (
        "lockkit locked_update's throughput is 2.00x hand-written select_for_update's: it holds a hot SKU's row "
        "for 1 round trip fewer (2 vs 3), and reservations of one SKU queue behind that lock."
    )
    # Fewer round trips under the lock and the same client CPU, yet slower: the load, not the lock or the code.
    assert lines[2].startswith(
        "lockkit guarded_update's throughput is 0.80x lockkit locked_update's: it holds"
    )
    assert "1 round trip fewer (1 vs 2) and spends 1.00x the client CPU" in lines[2]
    assert "yet that did not show in this run: the gap comes from the machine's load" in lines[2]
    assert len(lines) == 3
    # ... or more client CPU: that is what the note names.
    costly = {**measured, "guarded": _trips(1, cpu=1.5)}
    assert (
        "it spends 1.50x the client CPU per reservation, which counts more than the lock"
        in (throughput_note(sales, costly, workers=4)[2])
    )

    # The same lock hold: client CPU, or the machine's load.
    same = {"hand": _trips(2), "lockkit": _trips(2, cpu=1.5), "guarded": _trips(2, cpu=1.5)}
    lines = throughput_note(sales, same, workers=4)
    assert "both hold a hot SKU's row for the same 2 round trips" in lines[1]
    assert "lockkit locked_update spends 1.50x hand-written select_for_update's client CPU" in lines[1]
    assert "machine's load" in lines[2]

    # More round trips under the lock and slower: the lock explains it.
    more = {"hand": _trips(1), "lockkit": _trips(2), "guarded": _trips(1)}
    lines = throughput_note([_result("hand", 1000, 1.0), _result("lockkit", 1000, 2.0)], more, workers=4)
    assert lines[1].endswith(
        "1 round trip more (2 vs 1), and reservations of one SKU queue behind that lock."
    )

    assert throughput_note(sales, {**measured, "lockkit": None}, workers=4) == [
        "(round trips not counted: libpq tracing is not available with this psycopg)"
    ]
    # Only one of a pair: the measured line, no comparison.
    assert len(throughput_note(sales[1:2], {"lockkit": _trips(2)}, workers=4)) == 1
    assert not math.isnan(sales[0].totals.throughput)


def test_the_throughput_note_reports_what_the_naive_sale_did() -> None:
    naive = _result("naive", 200, 1.0, oversold=7)
    lines = throughput_note([naive], {"naive": _trips(1)}, workers=4)
    assert lines[1].startswith("naive read-then-write (200 orders) oversold 7 units and lost 7 to overwrites")
    lucky = _result("naive", 200, 1.0)
    lines = throughput_note([lucky], {"naive": _trips(1)}, workers=4)
    assert lines[1].startswith("naive read-then-write (200 orders) happened to oversell nothing this time")


@pytest.mark.parametrize(
    ("function", "shown"),
    [
        (sale_implementations()["guarded"], "sample_project/inventory/guarded.py:21 reserve_stock_guarded"),
        (sale_implementations()["naive"], "sample_project/inventory/naive.py:18 reserve_stock_naive"),
        (sale_implementations()["hand"], "sample_project/inventory/handwritten.py:19 reserve_stock_by_hand"),
        (count_round_trips, "sample_project/demo/roundtrips.py:"),
    ],
)
def test_code_of_names_the_file_line_and_function(function: Callable[..., object], shown: str) -> None:
    assert code_of(function).startswith(shown)
