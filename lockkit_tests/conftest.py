"""Shared fixtures: a short deadlock_timeout on the test databases, so deliberate deadlocks resolve fast."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> None:
    with django_db_blocker.unblock():
        for alias in connections:
            connection = connections[alias]
            test_name = connection.creation._get_test_db_name()  # type: ignore[attr-defined]
            if connection.vendor != "postgresql" or connection.settings_dict["NAME"] != test_name:
                continue  # not a PostgreSQL test database this session created
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_database()")
                (name,) = cursor.fetchone()
                # deadlock_timeout is superuser-only; the constant is ours, the name is quoted by Django.
                cursor.execute(
                    f"ALTER DATABASE {connection.ops.quote_name(name)} SET deadlock_timeout = '100ms'"
                )
            connection.close()
