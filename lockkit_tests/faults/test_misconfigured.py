"""Connection settings the server refuses (a database or user it does not have): a typed ``DatabaseMisconfigured``
at once from every entry point, never retried, on PostgreSQL and MariaDB alike.

Found by a newcomer's first hour (issue 34): a misspelt ``NAME`` was classified as a lost connection, so every call
reconnected for its ``reconnect_within`` and ``lockkit_worker`` waited at start for ever. A server that refuses
connections (down, restarting) is still retried: ``test_refused.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import OperationalError
from django.test import override_settings

import lockkit
from lockkit import ConnectionLost, DatabaseMisconfigured, Failure, RetryEvent
from lockkit_tests.faults.test_refused import ENTRIES
from lockkit_tests.support.faultkit import extra_alias
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON

# Aliases declared as mirrors in the test settings, pointed here at settings the server refuses.
MIRRORS = {"postgresql": ("restartable", "default"), "mysql": ("proxied_mariadb", "mariadb")}
WRONG = {
    "name": {"NAME": "ha_no_such_database"},
    "user": {"USER": "ha_no_such_user"},
    "password": {"PASSWORD": "ha-wrong-password"},
}
# What each vendor reports for each: PostgreSQL 3D000 / 28000 (role "..." does not exist; recognised by the
# message, psycopg gives no code), MariaDB 1049 / 1045 or 1698 (access denied, the user unknown or the password
# wrong; MariaDB 10.11 answers 1698 for an unknown user when no password is given). The test server trusts every
# local PostgreSQL connection: a wrong password is pinned on MariaDB only (28P01 by its message in test_table).
CODES = {
    ("postgresql", "name"): {"3D000"},
    ("postgresql", "user"): {"28000"},
    ("mysql", "name"): {"1049"},
    ("mysql", "user"): {"1045", "1698"},
    ("mysql", "password"): {"1045"},
}
MARKS = {
    "postgresql": [pytest.mark.django_db(transaction=True, databases=["default", "restartable"])],
    "mysql": [pytest.mark.django_db(transaction=True, databases=["default", "mariadb", "proxied_mariadb"])]
    if MYSQL_CONFIGURED
    else [pytest.mark.skip(reason=MYSQL_SKIP_REASON)],
}
# Only the cases a server can refuse (a skip would fail CI, where every server is available).
CASES = [pytest.param(case, marks=MARKS[case[0]], id="-".join(case)) for case in sorted(CODES)]
RETRIES: list[RetryEvent] = []
# Long enough that a retried refusal would be plain: the calls below must raise at their first attempt.
POLICY = {"reconnect_within": 30, "before_retry": RETRIES.append}


@pytest.fixture(params=CASES)
def refused(request: pytest.FixtureRequest) -> Iterator[tuple[str, set[str]]]:
    vendor, wrong = request.param
    mirror, like = MIRRORS[vendor]
    RETRIES.clear()
    with override_settings(LOCKKIT={"RETRY": POLICY}):
        with extra_alias(mirror, like, **WRONG[wrong]):
            yield mirror, CODES[vendor, wrong]


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_settings_the_server_refuses_are_a_typed_error_at_once_at_every_entry_point(
    refused: tuple[str, set[str]], entry: str
) -> None:
    alias, codes = refused
    with pytest.raises(DatabaseMisconfigured) as caught:
        ENTRIES[entry](alias)
    error = caught.value
    assert RETRIES == []  # not one retry, whatever reconnect_within allows
    assert error.attempts == 1
    assert error.alias == alias
    assert error.sqlstate in codes
    assert error.failure is Failure.DATABASE_MISCONFIGURED
    assert isinstance(error, OperationalError)  # ``except OperationalError`` keeps working
    assert not isinstance(error, ConnectionLost)  # ``except ConnectionLost: wait and try again`` would loop
    assert lockkit.classify(error) is Failure.DATABASE_MISCONFIGURED
    assert "DATABASES[alias]" in str(error)  # the hint: what to fix


def test_a_retry_policy_cannot_ask_for_them() -> None:
    with pytest.raises(ValueError, match="DATABASE_MISCONFIGURED"):
        lockkit.RetryPolicy(retry_on={Failure.DATABASE_MISCONFIGURED})
