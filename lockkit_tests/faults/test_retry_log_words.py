"""The retry and give-up log lines of lockkit's own calls say what was being done in the user's words ("claiming
jobs", "renewing the worker's leases on its jobs"), never an internal function's name (issue 34: a worker's log
showed ``_renew_held.<locals>.work failed with connection_lost``). A refused server makes every call retry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import override_settings

import lockkit
from lockkit import ConnectionLost, RetryEvent
from lockkit.claims import claim_next, heartbeat_held, held_by, reclaim_expired
from lockkit_harness.cluster import free_port
from lockkit_tests.models import Job
from lockkit_tests.support.faultkit import extra_alias

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "restartable"])

EVENTS: list[RetryEvent] = []
# Short: the refusal is certain; long enough for a retry or two before the give-up.
POLICY = {"reconnect_within": 0.3, "before_retry": EVENTS.append, "on_give_up": EVENTS.append}

CALLS: dict[str, tuple[Callable[[str], Any], str]] = {
    "claim_next": (
        lambda alias: claim_next(Job.objects.using(alias).filter(state="pending"), worker="w", lease=30),
        "claiming jobs",
    ),
    "heartbeat_held": (
        lambda alias: heartbeat_held(Job.objects.using(alias), worker="w", lease=30),
        "renewing the worker's leases on its jobs",
    ),
    "reclaim_expired": (
        lambda alias: reclaim_expired(Job.objects.using(alias)),
        "handing back expired claims on jobs",
    ),
    # In a scope (a locked operation of lockkit's own), not one message: the other path to the retry loop.
    "held_by": (
        lambda alias: held_by(Job.objects.using(alias), worker="w"),
        "reading the worker's claims on jobs",
    ),
}


@pytest.fixture
def refusing() -> Iterator[str]:
    EVENTS.clear()
    with override_settings(LOCKKIT={"RETRY": POLICY}):
        with extra_alias("restartable", "default", HOST="127.0.0.1", PORT=free_port(), OPTIONS={}):
            yield "restartable"


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "lockkit" and r.getMessage().startswith("lockkit: ")
    ]


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_claims_calls_retry_log_lines_say_what_it_was_doing(
    refusing: str, call: str, caplog: pytest.LogCaptureFixture
) -> None:
    run, doing = CALLS[call]
    with caplog.at_level(logging.INFO, logger="lockkit"), pytest.raises(ConnectionLost):
        run(refusing)
    lines = [line for line in _lines(caplog) if "failed with" in line or "gave up" in line]
    assert any("retrying in" in line for line in lines), lines
    assert any("gave up" in line for line in lines), lines
    for line in lines:
        assert line.startswith(f"lockkit: {doing} "), line
        assert "<locals>" not in line
    assert EVENTS
    assert {event.doing for event in EVENTS} == {doing}
    records = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert {getattr(r, "doing", None) for r in records} == {doing}  # the extra field, for structured logs


def test_a_function_you_decorated_is_named_as_before(refusing: str, caplog: pytest.LogCaptureFixture) -> None:
    def reserve() -> None:
        pass  # pragma: no cover (never entered)

    with caplog.at_level(logging.INFO, logger="lockkit"), pytest.raises(ConnectionLost):
        lockkit.locked_operation(refusing)(reserve)()
    lines = [line for line in _lines(caplog) if "retrying in" in line]
    assert lines
    assert all(
        ".test_a_function_you_decorated_is_named_as_before.<locals>.reserve failed" in x for x in lines
    )
    assert {event.doing for event in EVENTS} == {event.operation for event in EVENTS}
