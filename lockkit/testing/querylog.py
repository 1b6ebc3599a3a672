"""``assert_single_alias``: fail when a query inside a block runs on another database alias than expected.

Built on Django's database instrumentation (``execute_wrapper``):
https://docs.djangoproject.com/en/stable/topics/db/instrumentation/.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from lockkit.scopes.aliases import check_alias


@dataclass
class AliasLog:
    """Queries seen by ``assert_single_alias``, in order.

    Attributes:
        alias: The alias every query was expected on.
        queries: ``(alias, sql)`` pairs, one per statement executed in the block.
    """

    alias: str
    queries: list[tuple[str, str]] = field(default_factory=list)

    def on(self, alias: str) -> list[str]:
        """Return the SQL of the statements that ran on ``alias``."""
        return [sql for name, sql in self.queries if name == alias]

    @property
    def strays(self) -> list[tuple[str, str]]:
        """The ``(alias, sql)`` pairs that ran on another alias than ``self.alias``."""
        return [(name, sql) for name, sql in self.queries if name != self.alias]


@contextmanager
def assert_single_alias(alias: str) -> Iterator[AliasLog]:
    """Fail if any query inside the block runs on another database alias than ``alias``.

    Every configured alias is watched, in the calling thread (Django's connections are per thread; queries
    made by other threads are not seen). Transaction statements that go through a cursor (``SAVEPOINT``,
    ``set_config``) count as queries; on PostgreSQL with psycopg 3 an outermost scope's opening (``BEGIN`` and its
    ``set_config``) rides on the scope's first statement, in the same message, and is seen as that statement. The
    check runs when the block exits without an exception.

    Args:
        alias: The one alias queries may run on.

    Yields:
        An ``AliasLog`` of every query seen, filled in as the block runs.

    Raises:
        AssertionError: on exit, a query ran on another alias; the message lists each one with its SQL.
        TypeError, ValueError: ``alias`` is not a configured alias.
    """
    check_alias(alias, "alias")
    log = AliasLog(alias)

    def watcher(name: str) -> Callable[..., Any]:
        def record(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
            log.queries.append((name, sql))
            return execute(sql, params, many, context)

        return record

    with ExitStack() as stack:
        for name in connections:
            stack.enter_context(connections[name].execute_wrapper(watcher(name)))
        yield log
    strays = log.strays
    if strays:
        listing = "\n".join(f"  on {name!r}: {sql}" for name, sql in strays)
        raise AssertionError(f"{len(strays)} query(ies) ran on another alias than {alias!r}:\n{listing}")


__all__ = ["AliasLog", "assert_single_alias"]
