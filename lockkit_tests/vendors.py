"""Parametrising a test over the vendors the suite can reach: PostgreSQL always, MariaDB when configured.

Each parameter carries its own ``django_db`` mark, so a PostgreSQL run never creates or flushes the MariaDB
test database, and a missing ``LOCKKIT_TEST_MYSQL_URL`` shows up as a skip with its reason, never as a pass.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

MYSQL_CONFIGURED = "mariadb" in settings.DATABASES
MYSQL_SKIP_REASON = "MariaDB tests need LOCKKIT_TEST_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/lk_testing)"


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
