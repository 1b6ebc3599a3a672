"""Entry point for a process that decrements one row with ``locked_update`` many times (``spawn`` method)."""

from __future__ import annotations

from typing import Any

from lockkit_tests.support.claim_worker import setup_django


def decrement(
    database_names: dict[str, str], alias: str, sku: str, times: int, start: Any, results: Any
) -> None:
    """Wait at ``start`` (a barrier), decrement row ``sku`` ``times`` times, put ``(pid, values)`` on ``results``.

    ``values`` are the row's values as each call wrote them; an exception is put on ``results`` as its ``repr``.
    """
    import os

    setup_django(database_names)
    from django.db import connections

    import lockkit
    from lockkit_tests.models import Stock

    written: list[int] = []
    try:
        start.wait(120)
        queryset = Stock.objects.using(alias).filter(sku=sku)
        for _ in range(times):
            row = lockkit.locked_update(
                queryset, lambda row: {"available": row.available - 1}, lock_timeout=10
            )
            written.append(row.available)
        results.put((os.getpid(), written))
    except BaseException as exc:
        results.put((os.getpid(), repr(exc)))
    finally:
        connections.close_all()
