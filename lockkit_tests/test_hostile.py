"""Hostile and careless use of the features that landed together: each test pins a bug found and fixed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import DataError, connections, transaction
from django.dispatch import Signal

import lockkit
from lockkit import signals
from lockkit.claims import claim_next
from lockkit_tests.models import Job, Stock


class MetricsDown(Exception):
    pass


@contextmanager
def broken_receivers(*names: str) -> Iterator[list[str]]:
    """Connect a receiver raising ``MetricsDown`` to each named signal; yield the names of those that ran."""
    ran: list[str] = []
    connected: list[tuple[Signal, Any]] = []
    for name in names:
        signal: Signal = getattr(signals, name)

        def receiver(sender: object, *, _name: str = name, **kwargs: Any) -> None:
            ran.append(_name)
            raise MetricsDown(_name)

        signal.connect(receiver, weak=False)
        connected.append((signal, receiver))
    try:
        yield ran
    finally:
        for signal, receiver in connected:
            signal.disconnect(receiver)


OPERATION_SIGNALS = ("operation_started", "attempt_started", "attempt_finished", "operation_finished")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", [*OPERATION_SIGNALS, "lock_acquired"])
def test_a_raising_receiver_never_fails_or_rolls_back_the_operation(name: str) -> None:
    Stock.objects.create(sku="s", available=5)
    calls: list[int] = []

    @lockkit.locked_operation
    def reserve() -> int:
        calls.append(1)
        stock = lockkit.current_scope().get(Stock, pk="s")
        stock.available -= 1
        stock.save()
        return stock.available

    with broken_receivers(name) as ran:
        assert reserve() == 4
    assert ran == [name]
    assert calls == [1]  # not retried, not re-run
    assert Stock.objects.get(pk="s").available == 4  # committed


@pytest.mark.django_db(transaction=True)
def test_a_raising_claim_receiver_does_not_lose_the_claim() -> None:
    Job.objects.create(state="ready")
    with broken_receivers("claim_made") as ran:
        claims = claim_next(Job.objects.all(), worker="w1", lease=60)
    assert ran == ["claim_made"]
    assert len(claims) == 1
    assert Job.objects.get().claimed_by == "w1"


def advisory_locks_held(alias: str = "default") -> int:
    """Advisory locks the thread's own session holds (``pg_locks``)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.django_db(transaction=True)
def test_a_session_lock_in_an_aborted_atomic_block_is_not_left_on_the_connection() -> None:
    with pytest.raises(DataError), transaction.atomic():
        with lockkit.advisory_lock("hostile-session", session=True):
            assert advisory_locks_held() == 1
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT 1 / 0")  # aborts the transaction: the release cannot run in it
    # The connection is reused by this thread: no session-level lock may stay on it.
    assert advisory_locks_held() == 0
