"""Which other aliases committed while an attempt was open: such an attempt is never run again.

There is no two-phase commit across databases: when work committed on alias B during an attempt on alias A (a
nested scope, a ``locked_update`` or a claims call on B), re-running the A attempt would do the B work twice. Every
attempt (a scope's, or one of lockkit's own messages') is recorded here for as long as it is open, in a
``ContextVar`` (per thread and per task); whatever commits tells the open ones.
"""

from __future__ import annotations

from contextvars import ContextVar, Token


class Attempt:
    """One open attempt on ``alias``, and the other aliases on which work committed while it was open.

    Attributes:
        alias: The attempt's database alias.
        elsewhere: The other aliases that committed during the attempt, in order.
    """

    def __init__(self, alias: str) -> None:
        """Record an attempt on ``alias`` (``push`` opens it)."""
        self.alias = alias
        self.elsewhere: tuple[str, ...] = ()


_open: ContextVar[tuple[Attempt, ...]] = ContextVar("lockkit_open_attempts", default=())


def push(attempt: Attempt) -> Token[tuple[Attempt, ...]]:
    """Open ``attempt``; give the token back to ``pop``."""
    return _open.set((*_open.get(), attempt))


def pop(token: Token[tuple[Attempt, ...]]) -> None:
    """Close the attempt ``push`` opened."""
    _open.reset(token)


def committed(alias: str) -> None:
    """Work committed on ``alias``: every open attempt on another alias can no longer be run again."""
    for attempt in _open.get():
        if attempt.alias != alias and alias not in attempt.elsewhere:
            attempt.elsewhere = (*attempt.elsewhere, alias)


def note(error: BaseException, alias: str, elsewhere: tuple[str, ...]) -> None:
    """Say on ``error`` (once) that work committed on ``elsewhere`` during the failed attempt on ``alias``."""
    names = ", ".join(repr(name) for name in elsewhere)
    text = (
        f"lockkit: work committed on database {names} during this attempt on {alias!r}; it stays committed "
        "although this attempt failed, and the attempt is not retried: there is no two-phase commit across "
        "databases (see 'Operations that touch two databases' in lockkit's usage docs)"
    )
    if text not in getattr(error, "__notes__", ()):
        error.add_note(text)
