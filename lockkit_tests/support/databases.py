"""Session fixtures for the test databases, for every test the suite collects (loaded by the root conftest.py).

A short deadlock_timeout on the PostgreSQL test databases, so deliberate deadlocks resolve fast; the SQLite test
directory and the topology servers made before the test databases. Loaded as a plugin rather than from
lockkit_tests/conftest.py so that tests outside lockkit_tests (sample_project, the doc examples) get the same setup
whichever of them runs first.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from lockkit_tests.settings import ORIGINAL_DB_NAMES
from lockkit_tests.support import topology


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> None:
    with django_db_blocker.unblock():
        for alias in connections:
            connection = connections[alias]
            switched = connection.settings_dict["NAME"] != ORIGINAL_DB_NAMES.get(alias)
            mirror = connection.settings_dict.get("TEST", {}).get("MIRROR")
            if connection.vendor != "postgresql" or not switched or mirror:
                continue  # not a PostgreSQL test database this session created
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_database()")
                (name,) = cursor.fetchone()
                # deadlock_timeout is superuser-only; the constant is ours, the name is quoted by Django.
                cursor.execute(
                    f"ALTER DATABASE {connection.ops.quote_name(name)} SET deadlock_timeout = '100ms'"
                )
            connection.close()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None, request: pytest.FixtureRequest
) -> Iterator[None]:
    """Make the SQLite test directory, and start the primary/standby/PgBouncer servers if a test needs them,
    before the test databases are made; remove both after."""
    sqlite_dir = os.path.dirname(settings.DATABASES["sqlite"]["TEST"]["NAME"])
    os.makedirs(sqlite_dir, exist_ok=True)
    try:
        with topology.servers_for(request.session.items):
            yield
    finally:
        shutil.rmtree(sqlite_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def _pgbouncer_stopped_before_teardown(django_db_setup: None) -> Iterator[None]:
    """Stop the session's PgBouncer before the test databases are dropped: its server connections would keep
    the primary's test database from being dropped (torn down before ``django_db_setup``, which it follows)."""
    yield
    topology.stop_pgbouncer()


@pytest.fixture(autouse=True)
def _pgbouncer_users_stop_it_before_teardown(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("django_db")
    if marker is not None and "pgbouncer" in marker.kwargs.get("databases", ()):
        request.getfixturevalue("_pgbouncer_stopped_before_teardown")
