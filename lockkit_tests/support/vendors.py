"""Parametrising a test over the vendors the suite can reach: PostgreSQL always, MariaDB when configured,
PgBouncer when the topology can run (``target_params``).

Each parameter carries its own ``django_db`` mark, so a PostgreSQL run never creates or flushes the MariaDB
test database, and a missing ``LOCKKIT_TEST_MYSQL_URL`` shows up as a skip with its reason, never as a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings

from lockkit_tests.support import topology

MYSQL_CONFIGURED = "mariadb" in settings.DATABASES
MYSQL_SKIP_REASON = "MariaDB tests need LOCKKIT_TEST_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/lockkit)"


def vendor_params(*extra_databases: str) -> list[Any]:
    """One ``pytest.param`` per vendor alias, marked transactional on it (plus ``extra_databases``)."""
    params = [
        pytest.param(
            "default",
            id="postgresql",
            marks=[pytest.mark.django_db(transaction=True, databases=["default", *extra_databases])],
        )
    ]
    # "default" too: Django sets up a non-default test database only after "default" (TEST["DEPENDENCIES"]).
    mariadb_databases = ["default", "mariadb", *extra_databases]
    mariadb_marks: list[Any] = [pytest.mark.django_db(transaction=True, databases=mariadb_databases)]
    if not MYSQL_CONFIGURED:
        mariadb_marks = [pytest.mark.skip(reason=MYSQL_SKIP_REASON)]
    params.append(pytest.param("mariadb", id="mariadb", marks=mariadb_marks))
    return params


@dataclass(frozen=True)
class Target:
    """Where a cross-vendor scenario runs.

    Attributes:
        alias: The alias lockkit runs on.
        data: The alias the test writes and checks rows on directly (PgBouncer's is the primary behind it).
        deadlock_code: The code the database reports a deadlock with.
    """

    alias: str
    data: str
    deadlock_code: str


def target_params() -> list[Any]:
    """``vendor_params()`` plus PgBouncer in transaction pooling mode (skipped with its reason when missing)."""
    postgresql, mariadb = vendor_params()
    bouncer_marks: list[Any] = [
        pytest.mark.django_db(transaction=True, databases=["default", "primary", "pgbouncer"])
    ]
    if (missing := topology.missing()) is not None:
        bouncer_marks = [pytest.mark.skip(reason=f"no PgBouncer topology: {missing}")]
    return [
        pytest.param(Target("default", "default", "40P01"), id="postgresql", marks=postgresql.marks),
        pytest.param(Target("mariadb", "mariadb", "1213"), id="mariadb", marks=mariadb.marks),
        pytest.param(Target("pgbouncer", "primary", "40P01"), id="pgbouncer", marks=bouncer_marks),
    ]
