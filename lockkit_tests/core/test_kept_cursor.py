"""The kept cursor of lockkit's frequent statements (``lockkit._engine.cursors``) does what ``cursor()`` does first.

Django's ``connection.cursor()`` runs the health check (``CONN_HEALTH_CHECKS``), makes the cursor in the current
time zone, and goes through a test case's guard on a database the test did not declare. A cursor kept across calls
must not skip any of these: each test below fails when the kept cursor is used again regardless.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from django.db import connection, connections
from django.db.utils import load_backend
from django.test import TransactionTestCase
from django.test.utils import override_settings

from lockkit._engine import cursors
from lockkit_harness import sessions

# ``other`` too: pytest-django creates the test databases its collected tests ask for, and the guard test's class
# (below) must not declare it.
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])


def _pid(connection: Any) -> int:
    with cursors.kept(connection) as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


@pytest.fixture
def checked() -> Iterator[Any]:
    """A connection to the test database with ``CONN_HEALTH_CHECKS`` on and persistent (``CONN_MAX_AGE=None``)."""
    settings = {**connections["default"].settings_dict, "CONN_HEALTH_CHECKS": True, "CONN_MAX_AGE": None}
    wrapper = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, "default")
    try:
        yield wrapper
    finally:
        wrapper.close()


def test_a_session_the_server_ended_between_requests_is_replaced_by_the_health_check(checked: Any) -> None:
    first = _pid(checked)
    assert _pid(checked) == first  # the same session, the kept cursor used again
    checked.close_if_unusable_or_obsolete()  # the end of a request: the next one checks the connection first
    assert sessions.terminate("default", first)
    with cursors.kept(checked) as cursor:  # the health check finds the session gone and connects anew
        cursor.execute("SELECT 41 + 1, pg_backend_pid()")
        answer, pid = cursor.fetchone()
    assert (answer, pid != first) == (42, True)


def test_a_cursor_kept_before_the_time_zone_setting_changed_is_not_used_after() -> None:
    connection = connections["default"]
    with cursors.kept(connection) as cursor:
        cursor.execute("SELECT now()")
        assert cursor.fetchone()[0].tzinfo is not None  # USE_TZ = True: aware
    with override_settings(USE_TZ=False), cursors.kept(connection) as cursor:
        cursor.execute("SELECT now()")
        assert cursor.fetchone()[0].tzinfo is None  # as a cursor made now: naive
    with cursors.kept(connection) as cursor:
        cursor.execute("SELECT now()")
        assert cursor.fetchone()[0].tzinfo is not None


def test_django_db_connection_a_proxy_is_served_by_its_own_cursor() -> None:
    # ``django.db.connection`` forwards attribute reads to this thread's default connection; its class has no
    # ``cursor`` of its own.
    with cursors.kept(connection) as cursor:
        cursor.execute("SELECT 41 + 1, pg_backend_pid()")
        answer, pid = cursor.fetchone()
    assert (answer, pid) == (42, sessions.session_of("default"))


@pytest.mark.usefixtures("django_db_setup")  # the test databases exist before setUpClass
class UndeclaredDatabaseTests(TransactionTestCase):
    """Django's guard on ``other`` (not in ``databases``) refuses a statement though a cursor was kept before."""

    databases: ClassVar[set[str]] = {"default"}  # type: ignore[misc]
    available_apps: ClassVar[list[str]] = ["lockkit_tests"]  # type: ignore[misc]

    @classmethod
    def setUpClass(cls) -> None:
        with cursors.kept(connections["other"]) as cursor:  # kept before the guard is put on ``other``
            cursor.execute("SELECT 1")
        super().setUpClass()

    def test_the_guard_refuses_the_statement(self) -> None:
        # Django's DatabaseOperationForbidden, an AssertionError.
        with (
            pytest.raises(AssertionError, match="Database queries to 'other' are not allowed"),
            cursors.kept(connections["other"]) as cursor,
        ):
            cursor.execute("SELECT 1")
