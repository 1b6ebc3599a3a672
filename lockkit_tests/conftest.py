"""Fixtures shared by lockkit's test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lockkit_harness.proxy import FaultProxy
from lockkit_tests.support.faultkit import proxied


@pytest.fixture
def through_proxy() -> Iterator[tuple[str, FaultProxy]]:
    """The ``"proxied"`` alias, reaching the default database through a ``FaultProxy``: ``(alias, proxy)``."""
    with proxied("default") as pair:
        yield pair
