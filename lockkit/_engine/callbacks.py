"""lockkit's own record of the ``on_commit`` callbacks registered through it in one transaction.

Each callback is registered with Django (``transaction.on_commit``), which runs it after the COMMIT as usual, and
recorded here as well. When a COMMIT's reply is lost (or interrupted) Django forgets its callbacks; if the engine
then finds out that the transaction committed, it runs those of this record that have not run, once each, in
the order they were registered. lockkit never reads or writes Django's own list. Callbacks registered directly
with ``transaction.on_commit`` are not in this record: in that one case Django drops them. See
https://docs.djangoproject.com/en/stable/topics/db/transactions/#performing-actions-after-commit.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction

logger = logging.getLogger("lockkit")


class Callback:
    """One callback, run at most once whoever calls it first (Django after a COMMIT, or the engine)."""

    def __init__(self, func: Callable[[], Any], robust: bool) -> None:
        """Wrap ``func`` (its name and ``__qualname__`` too, which Django logs); ``robust`` as Django's."""
        functools.update_wrapper(self, func)
        self.func = func
        self.robust = robust
        self.ran = False

    def __call__(self) -> None:
        """Run the callback unless it already ran."""
        if self.ran:
            return
        self.ran = True
        self.func()


class Callbacks:
    """The callbacks one scope's transaction (or savepoint) registered through lockkit, in order."""

    def __init__(self) -> None:
        """An empty record."""
        self._entries: list[Callback] = []

    def register(self, alias: str, func: Callable[[], Any], *, robust: bool) -> None:
        """Register ``func`` with Django's ``transaction.on_commit`` on ``alias`` and record it here."""
        entry = Callback(func, robust)
        transaction.on_commit(entry, using=alias, robust=robust)
        self._entries.append(entry)

    def adopt(self, inner: Callbacks) -> None:
        """Take over the record of a nested scope that released its savepoint into this transaction."""
        self._entries.extend(inner._entries)
        inner._entries = []

    def run_pending(self, failed: Callable[[Exception], BaseException]) -> None:
        """Run, in order, the recorded callbacks that have not run: the transaction committed behind a lost reply.

        A robust callback's failure is logged; any other raises ``failed(error)`` from it, as Django's own
        ``on_commit`` would have let it propagate.
        """
        for entry in self._entries:
            if entry.ran:
                continue
            try:
                entry()
            except Exception as error:
                if not entry.robust:
                    raise failed(error) from error
                logger.exception("lockkit: a robust on_commit callback failed: %s", error)
