"""Temporary stand-in for the core branch's translator (same interface); replaced by the core version at merge."""

from __future__ import annotations

from types import TracebackType

from django.db import DatabaseError

from lockkit.errors import ERROR_FOR_FAILURE, LockError, classify
from lockkit.sqlstate import code_of


class translating:
    """Raise the typed lockkit error for a classified database failure in the block."""

    def __init__(self, alias: str, *, nowait: bool, attempts: int = 1) -> None:
        self.alias = alias
        self.nowait = nowait
        self.attempts = attempts

    def __enter__(self) -> None:
        """Nothing to set up."""

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, LockError):
            if exc.alias is None:
                exc.alias = self.alias
            return
        if not isinstance(exc, DatabaseError):
            return
        failure = classify(exc, nowait=self.nowait)
        if failure is None:
            return
        error = ERROR_FOR_FAILURE[failure](
            f"{failure.value} on database {self.alias!r}: {exc}".strip(),
            sqlstate=code_of(exc),
            alias=self.alias,
            attempts=self.attempts,
        )
        raise error from exc
