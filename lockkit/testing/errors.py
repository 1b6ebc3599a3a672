"""The one error the contention toolkit raises of its own: something expected did not happen in time."""

from __future__ import annotations


class ContentionTimeout(AssertionError):
    """A contention helper waited longer than its timeout: the expected lock, block or completion never
    happened.

    It subclasses ``AssertionError`` so that every test runner reports it as a test failure, not an error in
    the test's setup.
    """


__all__ = ["ContentionTimeout"]
