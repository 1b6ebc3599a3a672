"""The errors the contention toolkit raises of its own: something expected did not happen, or could not."""

from __future__ import annotations


class ContentionTimeout(AssertionError):
    """A contention helper waited longer than its timeout: the expected lock, block or completion never came.

    It subclasses ``AssertionError`` so that every test runner reports it as a test failure, not an error in
    the test's setup.
    """


class NothingLocked(AssertionError):
    """``hold_lock`` found no row to lock: its target matched no rows *as its own session sees them*.

    Usually the rows exist but are invisible to another connection: the test wrote them inside a transaction it
    has not committed (Django's ``TestCase``, ``pytest.mark.django_db`` without ``transaction=True``). It
    subclasses ``AssertionError``: the test, not the code under test, is wrong.
    """


def invisible_rows(found: str) -> str:
    """Explain ``found`` (a helper's session did not see a row): the test's uncommitted transaction hides it."""
    return (
        f"{found} Another connection cannot see rows written inside a transaction the test has not committed: "
        "Django's TestCase and pytest.mark.django_db without transaction=True wrap each test in one. Use "
        "TransactionTestCase or django_db(transaction=True) (the contention marker does it), or check the lookup."
    )


__all__ = ["ContentionTimeout", "NothingLocked"]
