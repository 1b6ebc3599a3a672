"""A model whose ``save()`` writes another row of its table first, saved in a ``locked_operation`` after ``get()``.

Both rows are in the operation's transaction: committed together, rolled back together; with the COMMIT's reply
cut after the server committed (``deliver``) both are committed and the call reports success; with the COMMIT never
delivered (``abort``) neither is, and a retry writes both once.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import lockkit
from lockkit import Failure, RetryEvent, RetryPolicy
from lockkit_harness.proxy import Action, FaultProxy
from lockkit_tests.models import TalliedStock

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "proxied"])


class AfterSave(Exception):
    pass


def _rows() -> dict[str, int]:
    return dict(TalliedStock.objects.values_list("sku", "available"))


def _setup() -> None:
    TalliedStock.objects.bulk_create(
        [TalliedStock(sku=TalliedStock.TALLY, available=0), TalliedStock(sku="widget", available=5)]
    )


def _sale(
    alias: str, proxy: FaultProxy, action: Action | None, *, retry: RetryPolicy | None, fail: bool = False
) -> tuple[Callable[[], int], list[int]]:
    attempts: list[int] = []

    @lockkit.locked_operation(alias, retry=retry)
    def sell() -> int:
        scope = lockkit.current_scope()
        attempts.append(scope.attempt)
        row = scope.get(TalliedStock, pk="widget")
        row.available -= 1
        row.save(using=alias)  # updates the tally row, then this one
        if fail:
            raise AfterSave
        if action is not None and scope.attempt == 1:
            proxy.arm(action)
        return row.available

    return sell, attempts


def test_both_rows_commit_together_or_not_at_all(through_proxy: tuple[str, FaultProxy]) -> None:
    alias, proxy = through_proxy
    _setup()
    failing, _ = _sale(alias, proxy, None, retry=None, fail=True)
    with pytest.raises(AfterSave):
        failing()
    assert _rows() == {"tally": 0, "widget": 5}
    sell, attempts = _sale(alias, proxy, None, retry=None)
    assert sell() == 4
    assert attempts == [1]
    assert _rows() == {"tally": 1, "widget": 4}


def test_a_cut_reply_of_a_commit_that_happened_reports_both_rows_done(
    through_proxy: tuple[str, FaultProxy],
) -> None:
    alias, proxy = through_proxy
    _setup()
    sell, attempts = _sale(alias, proxy, "deliver", retry=None)  # no retry to hide behind
    assert sell() == 4
    assert proxy.cuts["deliver"] == 1
    assert attempts == [1]
    assert _rows() == {"tally": 1, "widget": 4}


def test_a_commit_that_never_arrived_writes_neither_row(through_proxy: tuple[str, FaultProxy]) -> None:
    alias, proxy = through_proxy
    _setup()
    sell, attempts = _sale(alias, proxy, "abort", retry=None)
    with pytest.raises(lockkit.ConnectionLost) as caught:
        sell()
    assert not isinstance(caught.value, lockkit.CommitOutcomeUnknown)  # known: rolled back
    assert proxy.cuts["abort"] == 1
    assert attempts == [1]
    assert _rows() == {"tally": 0, "widget": 5}
    # Retried by the policy: the second attempt writes both rows, once.
    events: list[RetryEvent] = []
    sell, attempts = _sale(alias, proxy, "abort", retry=RetryPolicy(before_retry=events.append))
    assert sell() == 4
    assert attempts == [1, 2]
    assert [e.failure for e in events] == [Failure.CONNECTION_LOST]
    assert _rows() == {"tally": 1, "widget": 4}
