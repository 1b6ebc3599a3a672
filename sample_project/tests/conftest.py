"""Fixtures for the sample project's tests: stock rows, and a counter of lockkit retries."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import django
import pytest
from django.test import override_settings

from lockkit import RetryEvent, RetryPolicy
from sample_project.inventory.models import Stock


@pytest.fixture
def make_stock() -> Callable[..., None]:
    def make(**counts: int) -> None:
        Stock.objects.bulk_create(
            [Stock(sku=sku.replace("_", "-"), available=n) for sku, n in counts.items()]
        )

    return make


@pytest.fixture
def retries() -> Iterator[list[RetryEvent]]:
    """Every retry lockkit makes during the test (the default policy, with a hook that records the event)."""
    events: list[RetryEvent] = []
    with override_settings(LOCKKIT={"RETRY": RetryPolicy(before_retry=events.append), "LOCK_TIMEOUT": 5.0}):
        yield events


# The job queue's tasks need Django 6 (django.tasks): not collected on Django 5.2 (a skip would fail CI).
if django.VERSION < (6, 0):
    collect_ignore = ["test_tasks_queue.py"]
