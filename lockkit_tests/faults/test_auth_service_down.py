"""A server whose authentication service is down (``pg_hba.conf`` method ``ldap``, the LDAP server unreachable):
PostgreSQL answers ``LDAP authentication failed for user "..."``, the same words as for a wrong LDAP password, so
the client cannot tell the two apart. It is not ``DatabaseMisconfigured`` (refused again whatever one waits): it is
a lost connection, retried for ``reconnect_within``, and the call succeeds once the service answers again.

The settings the PostgreSQL server decides alone (no such database or role, a wrong password, a ``pg_hba.conf``
refusal, peer or certificate authentication) stay ``DatabaseMisconfigured``: ``test_misconfigured.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connections
from django.test import override_settings

import lockkit
from lockkit import ConnectionLost, Failure, RetryEvent
from lockkit_harness.cluster import TempCluster, missing_binaries
from lockkit_tests.support.faultkit import extra_alias

MISSING = missing_binaries()
ALIAS = "restartable"
PORT = 27011  # the throwaway cluster's
LDAP_PORT = 27012  # where its LDAP server would listen: nothing does
ROLE = "lockkit_ldap_user"

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=f"no throwaway cluster: {MISSING}"),
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS]),
]

LDAP = (
    f'host all {ROLE} 127.0.0.1/32 ldap ldapserver=127.0.0.1 ldapport={LDAP_PORT} ldapprefix="cn=" '
    'ldapsuffix=",dc=example"\n'
)
TRUST = "host all all 127.0.0.1/32 trust\nlocal all all trust\n"


def _admin(cluster: TempCluster) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        host="127.0.0.1", port=cluster.port, user="postgres", dbname="postgres", autocommit=True
    )


def _authenticate(cluster: TempCluster, rules: str) -> None:
    """Write ``pg_hba.conf`` and reload it (``pg_reload_conf()``); return once the server reads the new rules."""
    with _admin(cluster) as admin:
        (hba,) = admin.execute("SHOW hba_file").fetchone() or ("",)
        Path(str(hba)).write_text(rules)
        admin.execute("SELECT pg_reload_conf()")
    # pg_hba_file_rules reads the file, not what the server loaded: a connection as the role, refused or not,
    # says which rules the server applies.
    expected = ROLE in rules
    for _ in range(500):
        try:
            psycopg.connect(
                host="127.0.0.1",
                port=cluster.port,
                user=ROLE,
                password="x",
                dbname="postgres",
                connect_timeout=5,
            ).close()
            refused = False
        except psycopg.OperationalError as failure:
            refused = "LDAP authentication failed" in str(failure)
        if refused == expected:
            return
    raise AssertionError("the server did not apply the new pg_hba.conf")


@pytest.fixture(scope="module")
def cluster() -> Iterator[TempCluster]:
    with TempCluster(port=PORT) as started:
        with _admin(started) as admin:
            admin.execute(f"CREATE ROLE {ROLE} LOGIN SUPERUSER")
        yield started


def test_an_authentication_service_that_is_down_is_a_lost_connection_retried_until_it_answers(
    cluster: TempCluster,
) -> None:
    _authenticate(cluster, LDAP + TRUST)
    retries: list[RetryEvent] = []

    def back_after_first_refusal(event: RetryEvent) -> None:
        retries.append(event)
        if len(retries) == 1:
            _authenticate(cluster, TRUST)  # the LDAP server answers again (here: the role no longer needs it)

    policy = {"reconnect_within": 30, "before_retry": back_after_first_refusal}
    with (
        override_settings(LOCKKIT={"RETRY": policy}),
        extra_alias(
            ALIAS,
            "default",
            HOST="127.0.0.1",
            PORT=cluster.port,
            NAME="postgres",
            USER=ROLE,
            PASSWORD="x",
            OPTIONS={},
        ),
    ):
        with lockkit.locked(ALIAS) as scope:
            with connections[scope.alias].cursor() as cursor:
                cursor.execute("SELECT current_user")
                (user,) = cursor.fetchone()
    assert user == ROLE
    assert [event.failure for event in retries] == [Failure.CONNECTION_LOST]


def test_an_authentication_service_that_stays_down_is_a_connection_lost_not_a_misconfiguration(
    cluster: TempCluster,
) -> None:
    _authenticate(cluster, LDAP + TRUST)
    with (
        override_settings(LOCKKIT={"RETRY": {"reconnect_within": 0.5}}),
        extra_alias(
            ALIAS,
            "default",
            HOST="127.0.0.1",
            PORT=cluster.port,
            NAME="postgres",
            USER=ROLE,
            PASSWORD="x",
            OPTIONS={},
        ),
        pytest.raises(ConnectionLost) as caught,
    ):
        with lockkit.locked(ALIAS):
            pass  # pragma: no cover (never entered)
    assert "LDAP authentication failed" in str(caught.value)
    assert lockkit.classify(caught.value) is Failure.CONNECTION_LOST
