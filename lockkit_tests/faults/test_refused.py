"""A server that refuses connections (nothing listens on its port): every entry point raises the typed
``ConnectionLost``, after retrying for the policy's ``reconnect_within``, on PostgreSQL and MariaDB alike.

Before, MariaDB's refusal (mysqlclient's 2002, ``CR_CONNECTION_ERROR``) was not classified: every entry point raised
Django's bare ``OperationalError`` at once, and nothing retried it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from django.db.models import F
from django.test import override_settings

import lockkit
from lockkit import ConnectionLost
from lockkit.claims import claim_next
from lockkit_harness.cluster import free_port
from lockkit_tests.models import Job, Stock
from lockkit_tests.support.faultkit import extra_alias
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON

# Aliases declared as mirrors in the test settings, pointed here at a port nothing listens on.
MIRRORS = {"postgresql": ("restartable", "default"), "mysql": ("proxied_mariadb", "mariadb")}
BUDGET = 1.0  # seconds of LOCKKIT["RETRY"]["reconnect_within"]: short, the refusal is certain
VENDORS = [
    pytest.param(
        "postgresql", marks=pytest.mark.django_db(transaction=True, databases=["default", "restartable"])
    ),
    pytest.param(
        "mysql",
        marks=[pytest.mark.django_db(transaction=True, databases=["default", "mariadb", "proxied_mariadb"])]
        if MYSQL_CONFIGURED
        else [pytest.mark.skip(reason=MYSQL_SKIP_REASON)],
    ),
]


@pytest.fixture(params=VENDORS)
def refusing(request: pytest.FixtureRequest) -> Iterator[str]:
    mirror, like = MIRRORS[request.param]
    with override_settings(LOCKKIT={"RETRY": {"reconnect_within": BUDGET}}):
        with extra_alias(mirror, like, HOST="127.0.0.1", PORT=free_port(), OPTIONS={}):
            yield mirror


def _locked(alias: str) -> None:
    with lockkit.locked(alias):
        pass  # pragma: no cover (never entered)


ENTRIES: dict[str, Callable[[str], Any]] = {
    "locked": _locked,
    "locked_update": lambda alias: lockkit.locked_update(
        Stock.objects.using(alias).filter(sku="widget"), lambda row: {"available": 1}
    ),
    "guarded_update": lambda alias: lockkit.guarded_update(
        Stock.objects.using(alias).filter(sku="widget"), available=F("available") - 1
    ),
    "locked_operation": lambda alias: lockkit.locked_operation(alias)(lambda: None)(),
    "advisory_lock": lambda alias: lockkit.advisory_lock("refused", using=alias).__enter__(),
    "claim_next": lambda alias: claim_next(
        Job.objects.using(alias).filter(state="pending"), worker="w", lease=30, set={"state": "running"}
    ),
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_refused_connection_is_a_typed_connection_lost_at_every_entry_point(
    refusing: str, entry: str
) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionLost) as caught:
        ENTRIES[entry](refusing)
    assert caught.value.alias == refusing
    code = caught.value.sqlstate
    assert code in ({"2002", "2003"} if connections[refusing].vendor == "mysql" else {"08001", "08006", None})
    # Retried for LOCKKIT["RETRY"]["reconnect_within"] before giving up; not a MariaDB claims call that must ask
    # the server its version before it can begin (Django's features, on a connection's first use: the worker
    # waits out a server down at its start itself).
    first_use = entry == "claim_next" and connections[refusing].vendor == "mysql"
    if not first_use:
        assert time.monotonic() - started >= BUDGET
