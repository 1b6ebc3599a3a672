"""Small helpers shared by lockkit's tests."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import DEFAULT_DB_ALIAS, connections

import lockkit
from lockkit_tests.models import Stock


class InsufficientStock(Exception):
    """The domain refusal of the reservation used in tests."""


def show(setting: str, using: str = DEFAULT_DB_ALIAS) -> str:
    """Return ``SHOW <setting>`` on this thread's connection to ``using``."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT current_setting(%s)", [setting])
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


def raise_sqlstate(code: str, using: str = DEFAULT_DB_ALIAS) -> None:
    """Make the real server raise an error with SQLSTATE ``code`` (the code is a test constant)."""
    assert len(code) == 5
    assert code.isalnum()
    with connections[using].cursor() as cursor:
        cursor.execute(f"DO $$ BEGIN RAISE EXCEPTION 'lockkit test' USING ERRCODE = '{code}'; END $$")


@lockkit.locked_operation(lock_timeout=10)
def reserve(sku: str, quantity: int) -> int:
    """Reserve ``quantity`` units of ``sku`` and return what remains; refuse with ``InsufficientStock``."""
    stock = lockkit.current_scope().get(Stock, sku=sku)
    if stock.available < quantity:
        raise InsufficientStock(f"{sku}: {stock.available} < {quantity}")
    stock.available -= quantity
    stock.save(update_fields=["available"])
    return stock.available


def reserve_one_on(alias: str) -> Callable[[], bool]:
    """A locked operation on ``alias`` that takes one unit of the ``widget`` row; ``False`` when none is left."""

    @lockkit.locked_operation(alias, lock_timeout=10)
    def reserve() -> bool:
        item = lockkit.current_scope().get(Stock, pk="widget")
        if item.available == 0:
            return False
        item.available -= 1
        item.save(using=alias)
        return True

    return reserve


def identify_server(alias: str = "default") -> None:
    """Open one empty scope on ``alias``: the first scope on a connection also reads the server's identity.

    For tests that pin the exact text of a scope's opening statement (a connection's later scopes send it without
    the identity columns; test_opening.py pins the first one).
    """
    import lockkit

    with lockkit.locked(alias):
        pass


def run_threads(target: Callable[[int], object], count: int, timeout: float = 60) -> None:
    """Run ``target(0)`` ... ``target(count - 1)`` on threads of their own, all at once; fail if one is still
    running after ``timeout`` seconds (each join is bounded)."""
    threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads)
