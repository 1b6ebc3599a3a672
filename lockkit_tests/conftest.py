"""Fixtures shared by lockkit's test modules."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from lockkit_harness.proxy import FaultProxy
from lockkit_tests.support.faultkit import proxied

PATRONI = "patroni"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests marked ``patroni`` unless the ``-m`` expression names that marker.

    The Patroni topology test starts a cluster of its own and has a CI step of its own (``-m patroni``). A
    ``-m "not patroni"`` in ``addopts`` would not do: a later ``-m`` on the command line (``-m contention``)
    replaces it, and would run the Patroni test in that step too.
    """
    if PATRONI in (config.getoption("markexpr", "") or ""):
        return
    kept = [item for item in items if item.get_closest_marker(PATRONI) is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker(PATRONI)])
        items[:] = kept


@pytest.fixture
def through_proxy() -> Iterator[tuple[str, FaultProxy]]:
    """The ``"proxied"`` alias, reaching the default database through a ``FaultProxy``: ``(alias, proxy)``."""
    with proxied("default") as pair:
        yield pair


@pytest.fixture(autouse=True)
def _no_broken_connection_outlives_its_test() -> Iterator[None]:
    """After each test, close this thread's connections whose driver connection broke (a test's fault left it so).

    Django keeps a broken connection object until a request boundary, and pytest-django's teardown (the table flush)
    would fail on it, and so would every test after: one failure would read as hundreds. Runs before
    pytest-django's teardown (plugin autouse fixtures are set up first, so torn down last).
    """
    yield
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        raw = connection.connection
        if raw is not None and (getattr(raw, "broken", False) or getattr(raw, "closed", False)):
            connection.close()


@pytest.fixture
def ctrl_c_live() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` during the test, as in a terminal.

    A shell starts a background job (``cmd &``) with SIGINT ignored, and Python then keeps it ignored: a test that
    sends itself SIGINT would see nothing happen (a new user's trial ran the suite so: 7 failures).
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
