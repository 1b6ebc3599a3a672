"""lockkit's own record of the ``on_commit`` callbacks registered through it in one transaction.

Each callback is registered with Django (``transaction.on_commit``), which runs it after the COMMIT as usual, and
recorded here as well. When a COMMIT's reply is lost (or interrupted) Django forgets its callbacks; if the engine
then finds out that the transaction committed, it runs those of this record that have not run, once each, in
the order they were registered. lockkit never reads or writes Django's own list. Callbacks registered directly
with ``transaction.on_commit`` are not in this record: in that one case Django drops them. See
https://docs.djangoproject.com/en/stable/topics/db/transactions/#performing-actions-after-commit.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, cast

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
    """The callbacks registered through lockkit in one outermost transaction, in order, and its savepoints.

    ``watch()`` observes (never changes) the transaction's statements through Django's ``execute_wrapper()``: a
    ``ROLLBACK TO SAVEPOINT`` (an inner ``atomic()`` or a nested scope that rolled back, ``set_rollback(True)``
    included) drops the callbacks registered since that savepoint was made, as Django drops its own.
    """

    def __init__(self) -> None:
        """An empty record."""
        self._entries: list[Callback] = []
        self._savepoints: dict[str, int] = {}  # name -> how many callbacks were recorded when it was made
        self._create: tuple[str, str] = ("", "")
        self._rollback: tuple[str, str] = ("", "")

    def watch(self, connection: Any) -> contextlib.AbstractContextManager[None]:
        """Observe ``connection``'s savepoint statements for the rest of the transaction (a context manager)."""
        self._create = _around_name(connection.ops.savepoint_create_sql)
        self._rollback = _around_name(connection.ops.savepoint_rollback_sql)
        return cast(contextlib.AbstractContextManager[None], connection.execute_wrapper(self._observe))

    def _observe(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)  # recorded only once the server accepted it
        if params is None and isinstance(sql, str):
            made = _name_in(self._create, sql)
            if made is not None:
                self._savepoints[made] = len(self._entries)
            else:
                undone = _name_in(self._rollback, sql)
                if undone is not None:
                    del self._entries[self._savepoints.get(undone, 0) :]
        return result

    def register(self, alias: str, func: Callable[[], Any], *, robust: bool) -> None:
        """Register ``func`` with Django's ``transaction.on_commit`` on ``alias`` and record it here."""
        entry = Callback(func, robust)
        transaction.on_commit(entry, using=alias, robust=robust)
        self._entries.append(entry)

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


def _around_name(render: Callable[[str], str]) -> tuple[str, str]:
    """The text before and after the savepoint's name in the statement ``render(name)`` writes (Django's ops)."""
    before, _, after = render("\x00").partition("\x00")
    # The name is quoted by the backend (quote_name): the quotes are part of "before" and "after".
    return before, after


def _name_in(around: tuple[str, str], sql: str) -> str | None:
    before, after = around
    if before and sql.startswith(before) and sql.endswith(after) and len(sql) > len(before) + len(after):
        return sql[len(before) : len(sql) - len(after)]
    return None
