"""pytest plugin (entry point ``pytest11``): the ``contention`` marker and fixture for pytest-django users.

Everything Django is imported lazily, inside fixtures that run only for contention tests, so installing
lockkit never breaks a pytest run where Django is not configured. At configuration it also turns on the
unlocked-save check (``lockkit.UnlockedSaveWarning``, as in ``DEBUG``; pytest-django runs tests with ``DEBUG = False``)
for the session, unless the ini option ``lockkit_unlocked_save_warnings = false`` says not to; that reads no setting.
See docs/testing.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from lockkit.testing import ContentionKit

MARKER = "contention"
_MARKER_HELP = (
    "contention(timeout=10.0): a test that runs real concurrent database sessions. It gets a transactional "
    "database (pytest-django's django_db(transaction=True)) unless it has a django_db mark of its own, "
    "which must then be transactional; the contention fixture's waits default to timeout seconds."
)
_NOT_TRANSACTIONAL = (
    "{nodeid}: a contention test needs django_db(transaction=True): inside a TestCase transaction the rows "
    "the test wrote are invisible to the other sessions, and the locks it takes are never contended"
)


_UNLOCKED_SAVES = "lockkit_unlocked_save_warnings"
_UNLOCKED_SAVES_HELP = (
    "lockkit: warn (lockkit.UnlockedSaveWarning) when a locked scope saves an existing row of a model it locked "
    "rows of without locking that row, as in DEBUG (default: true)"
)
# The check's setting before the session turned it on, put back at the end.
_PREVIOUS = pytest.StashKey[bool | None]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``lockkit_unlocked_save_warnings`` ini option (default true)."""
    parser.addini(_UNLOCKED_SAVES, _UNLOCKED_SAVES_HELP, type="bool", default=True)


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``contention`` marker; turn on the unlocked-save check for the session (unless the ini says no)."""
    config.addinivalue_line("markers", _MARKER_HELP)
    if config.getini(_UNLOCKED_SAVES):
        from lockkit.scopes import unlocked

        config.stash[_PREVIOUS] = unlocked.force(True)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Put the unlocked-save check back as it was before the session."""
    if _PREVIOUS in config.stash:
        from lockkit.scopes import unlocked

        unlocked.force(config.stash[_PREVIOUS])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give tests marked ``contention`` a transactional database (pytest-django)."""
    if not config.pluginmanager.hasplugin("django"):
        return
    for item in items:
        uses_fixture = MARKER in getattr(item, "fixturenames", ())
        if item.get_closest_marker(MARKER) is None and not uses_fixture:
            continue
        # Marked here, at collection: pytest-django decides on a transactional database from the mark.
        if item.get_closest_marker("django_db") is None:
            item.add_marker(pytest.mark.django_db(transaction=True))


@pytest.fixture(autouse=True)
def _lockkit_contention_requires_transaction(request: pytest.FixtureRequest) -> None:
    """Fail a contention test whose django_db mark is not transactional, before it runs."""
    if request.node.get_closest_marker(MARKER) is None and MARKER not in request.fixturenames:
        return
    mark = request.node.get_closest_marker("django_db")
    if mark is not None and not (mark.kwargs.get("transaction") or (mark.args and mark.args[0])):
        pytest.fail(_NOT_TRANSACTIONAL.format(nodeid=request.node.nodeid), pytrace=False)
    test_class = getattr(request.node, "cls", None)
    if test_class is not None and _wraps_in_transaction(test_class):
        pytest.fail(_NOT_TRANSACTIONAL.format(nodeid=request.node.nodeid), pytrace=False)


def _wraps_in_transaction(test_class: type) -> bool:
    """Whether a unittest class is Django's ``TestCase`` (each test in a transaction), not ``TransactionTestCase``."""
    from django.test import TestCase

    return issubclass(test_class, TestCase)


@pytest.fixture
def contention(request: pytest.FixtureRequest) -> Iterator[ContentionKit]:
    """Return the contention helpers bound to this test, on a transactional database.

    The helpers are ``hold_lock``, ``wait_until_blocked``, ``in_thread``, ``run_concurrently``,
    ``assert_single_alias``...

    Threads started with ``contention.in_thread`` must have finished by the end of the test: one still running
    is cancelled and fails the test. The default timeout is the ``contention`` marker's ``timeout`` (10 s).
    """
    from lockkit.testing import ContentionKit

    marker = request.node.get_closest_marker(MARKER)
    timeout = 10.0
    if marker is not None:  # contention(timeout=3) or contention(3)
        timeout = marker.kwargs.get("timeout", marker.args[0] if marker.args else 10.0)
    kit = ContentionKit(timeout=timeout)
    try:
        yield kit
    finally:
        kit.close()
