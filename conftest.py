"""Runs every Python code block of README.md and of the pages in docs/ as a test (Sybil), on the test database.

A block that cannot run in the suite is marked just before it with ``<!-- skip: next "why" -->`` and reported as
skipped with that reason; ``lockkit_tests/docs/test_docs.py`` checks that every block is one or the other.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest
from sybil import Sybil
from sybil.integration.pytest import SybilItem
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

from lockkit_tests.support import doc_examples

# The test databases' session fixtures, for every directory of the suite (sample_project and the docs too).
pytest_plugins = ["lockkit_tests.support.databases"]

pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=list(doc_examples.DOCUMENTS),
    setup=doc_examples.setup,
    teardown=doc_examples.teardown,
    fixtures=["doc_database"],
).pytest()


@pytest.fixture(scope="module")
def doc_database(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """The test databases for one document: its examples build on each other's rows, like a reader's session.

    The rows are real and committed (other sessions see them, as the examples' contenders need); the tables are
    emptied before and after the document, as pytest-django's transactional tests do after each test.
    """
    with django_db_blocker.unblock():
        doc_examples.flush()
        try:
            yield
        finally:
            doc_examples.flush()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Report a block marked not runnable at its line of the Markdown file, not inside Sybil."""
    report = yield
    if isinstance(item, SybilItem) and report.skipped and isinstance(report.longrepr, tuple):
        report.longrepr = (
            str(item.path),
            item.example.line,
            "not runnable: " + str(report.longrepr[2]).removeprefix("Skipped: "),
        )
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the examples with the databases they use: pytest-django creates those the collected marks name."""
    for item in items:
        if isinstance(item, SybilItem):
            item.add_marker(pytest.mark.django_db(transaction=True, databases=list(doc_examples.DATABASES)))
