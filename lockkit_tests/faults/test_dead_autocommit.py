"""A connection lost when ``atomic()`` turns autocommit back on leaves the next call working.

Found by a hostile review through a relay cutting replies: the reply to ``SET autocommit=1``, which Django's
``atomic()`` exit sends after the COMMIT, was cut. Django's autocommit flag stayed off outside any ``atomic()``;
lockkit's check for a dead connection took that for a transaction the caller began and left the connection alone,
the next ``atomic()`` took it for the caller's own transaction, and every later call failed with "Cannot open a new
connection in an atomic block": a worker lived on and ran nothing. (PostgreSQL's driver turns autocommit on without
a round trip.)
"""

from __future__ import annotations

import pytest
from django.db import OperationalError, connections

from lockkit import CommitOutcomeUnknown, locked
from lockkit_harness import sessions
from lockkit_tests.models import Job
from lockkit_tests.support.faultkit import proxied
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON

MARIADB = pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON)
VENDORS = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True, databases=["default"])),
    pytest.param(
        "mariadb", marks=[MARIADB, pytest.mark.django_db(transaction=True, databases=["default", "mariadb"])]
    ),
]


@pytest.mark.parametrize("alias", VENDORS)
def test_a_dead_connection_with_autocommit_off_outside_atomic_is_discarded_after_the_loss(alias: str) -> None:
    """The state Django's failed exit leaves, made through its public API: autocommit off, the session dead, an error
    recorded on it. Before, lockkit left such a connection alone as the caller's transaction: the next ``atomic()``
    took it for one, and every later call failed on it.
    """
    connection = connections[alias]
    Job.objects.using(alias).create(name="a")
    connection.set_autocommit(False)
    try:
        assert sessions.terminate(alias, sessions.session_of(alias))
        with pytest.raises(OperationalError):  # Django records the error (errors_occurred)
            Job.objects.using(alias).count()
        for state in (
            "second",
            "third",
        ):  # lockkit discards the dead connection and reconnects, in autocommit
            with locked(alias):
                Job.objects.using(alias).update(state=state)
        assert connection.get_autocommit()
        assert not connection.in_atomic_block
    finally:
        if connection.connection is not None and not connection.in_atomic_block and not connection.autocommit:
            connection.close()
    assert list(Job.objects.using(alias).values_list("state", flat=True)) == ["third"]


@MARIADB
@pytest.mark.django_db(transaction=True, databases=["default", "mariadb", "proxied_mariadb"])
def test_a_connection_lost_turning_autocommit_back_on_leaves_the_next_call_working() -> None:
    Job.objects.using("mariadb").create(name="a")
    with proxied("mariadb", "proxied_mariadb") as (alias, proxy):
        # MariaDB cannot say whether a transaction committed: the exit's failure is "unknown", never success.
        with pytest.raises(CommitOutcomeUnknown), locked(alias):
            Job.objects.using(alias).update(state="first")
            proxy.arm("deliver", statement=b"SET AUTOCOMMIT")  # the exit's, after the COMMIT
        assert proxy.cuts["deliver"] == 1
        assert list(Job.objects.using("mariadb").values_list("state", flat=True)) == ["first"]  # it had
        # The next calls reconnect and commit.
        for state in ("second", "third"):
            with locked(alias):
                Job.objects.using(alias).update(state=state)
        assert not connections[alias].in_atomic_block
        assert connections[alias].get_autocommit()
    assert list(Job.objects.using("mariadb").values_list("state", flat=True)) == ["third"]
