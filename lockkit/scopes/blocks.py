"""Opening scopes: ``ScopeBlock`` (one ``LockScope`` for a ``with`` block, on the stack), ``Locked``/``locked()``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from django.db import connections, models

from lockkit._engine import commits
from lockkit._engine.transaction import in_transaction
from lockkit.advisory import held as advisory_locks
from lockkit.errors import Failure, NotInLockedScope
from lockkit.retries import call_with_retry, from_settings
from lockkit.scopes.options import FROM_SETTINGS, Duration, ScopeOptions
from lockkit.scopes.scope import LockScope
from lockkit.scopes.stack import scopes

#: What entering a plain ``locked()`` scope retries: a connection refused or lost while beginning.
_RECONNECTED = frozenset({Failure.CONNECTION_LOST})

P = ParamSpec("P")
R = TypeVar("R")


class ScopeBlock:
    """Opens one ``LockScope`` for a ``with`` block: its transaction, and its place on the stack of active scopes.

    Used by ``Locked`` and ``locked_operation``; ``owner`` is the object that opened it, so that it exits its own.
    """

    def __init__(
        self,
        options: ScopeOptions,
        alias: str,
        attempt: int,
        *,
        owner: object = None,
        resolve_within: float | None = None,
    ) -> None:
        """Prepare the scope (no SQL yet).

        ``resolve_within`` is how long a COMMIT whose reply was lost is resolved for (the operation's retry policy's
        ``reconnect_within``); ``None`` for the default, ``COMMIT_RESOLUTION_TIMEOUT``.

        Raises:
            django.db.NotSupportedError: the backend cannot honour the scope's locking options.
        """
        self.scope = LockScope(options, alias, attempt, resolve_within=resolve_within)
        self.owner = owner

    @property
    def active(self) -> bool:
        """Whether the block's scope is open."""
        return self.scope._active

    @property
    def committed(self) -> bool:
        """Whether the scope's own transaction has committed."""
        return self.scope.committed

    def __enter__(self) -> LockScope:
        """Begin the transaction and push the scope on this thread's (or task's) stack.

        Raises:
            LockError: the database reported a classified failure while beginning.
        """
        self.scope._transaction.__enter__()
        if self.scope._watch is not None:
            self.scope._watch.start()
        self.scope._active = True
        scopes.set((*scopes.get(), self))
        self._open = commits.push(self.scope._attempt)
        return self.scope

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Pop the scope and end its transaction, raising the typed error for a database failure.

        A scope that committed while others are open tells those on other aliases (their attempt can no longer be
        undone as a whole); a failing scope in which that happened says so in a note on its error.
        """
        scope = self.scope
        scope._active = False
        if scope._watch is not None:
            scope._watch.stop()
        enclosing = tuple(block for block in scopes.get() if block is not self)
        scopes.set(enclosing)
        commits.pop(self._open)
        try:
            scope._transaction.__exit__(exc_type, exc, tb)
        except BaseException as raised:
            self._end_advisory(succeeded=False)
            advisory_locks.name_holders(raised, scope.alias)
            if scope.committed_elsewhere:
                commits.note(raised, scope.alias, scope.committed_elsewhere)
            raise
        finally:
            if scope._transaction.committed:
                commits.committed(scope.alias)
        self._end_advisory(succeeded=exc is None)
        if exc is not None:
            # The transaction has rolled back (or back to the savepoint): an advisory lock wait that timed out in
            # it can now say who holds the key.
            advisory_locks.name_holders(exc, scope.alias)
            if scope.committed_elsewhere:
                commits.note(exc, scope.alias, scope.committed_elsewhere)

    def _end_advisory(self, *, succeeded: bool) -> None:
        """Release the advisory locks the transaction does not release by itself (MariaDB), on every path.

        A nested scope that succeeded hands them to the enclosing scope on its alias, as PostgreSQL keeps a
        transaction-scoped lock until the outermost transaction ends; otherwise they are released now. Never
        raises: the transaction's outcome is decided, and a lock that cannot be released has its connection closed
        (the server drops the locks of a closed session).
        """
        held, self.scope._advisory = self.scope._advisory, []
        if not held:
            return
        alias = self.scope.alias
        enclosing = next(
            (b.scope for b in reversed(scopes.get()) if b.scope.alias == alias and b.active), None
        )
        if succeeded and enclosing is not None:
            enclosing._advisory.extend(held)
            return
        for lock in reversed(held):
            advisory_locks.give_back(lock, raise_errors=False)


class Locked:
    """The object ``locked()`` returns: a context manager yielding a ``LockScope``, and a decorator.

    It holds only configuration; each ``with`` block gets its own ``LockScope``, so one ``Locked`` may be shared.
    """

    def __init__(self, options: ScopeOptions) -> None:
        """Hold the validated options."""
        self._options = options

    def __enter__(self) -> LockScope:
        """Open a scope on the alias the options resolve to.

        Raises:
            LockError: the database reported a classified failure while beginning.
        """
        alias = self._options.alias_for_call((), {})
        setting = None if in_transaction(connections[alias]) else from_settings(retry_on=_RECONNECTED)
        if setting is None:  # nested: a lost connection took the caller's transaction with it
            return ScopeBlock(self._options, alias, 1, owner=self).__enter__()

        def begin(number: int) -> LockScope:
            return ScopeBlock(self._options, alias, number, owner=self).__enter__()

        # A server refusing connections at entry (nothing of the block ran): tried again for reconnect_within.
        return call_with_retry(setting, begin, alias=alias, operation="lockkit.locked")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """End the innermost scope this object opened.

        A generator or another alias's scope may have opened others since, and exiting those instead would end
        the wrong transaction.
        """
        for block in reversed(scopes.get()):
            if block.active and block.owner is self:
                block.__exit__(exc_type, exc, tb)
                return
        raise NotInLockedScope("locked() exited without an active scope")  # pragma: no cover - misuse only

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        """Decorate ``func`` so each call runs inside this scope (never retried).

        Raises:
            TypeError: ``func`` is not a plain synchronous function.
        """
        refuse_unsupported(func, "locked")

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return func(*args, **kwargs)

        return wrapper


def refuse_unsupported(func: object, name: str) -> None:
    """Refuse what ``locked``/``locked_operation`` cannot decorate, naming it.

    Raises:
        TypeError: ``func`` is not callable, is a model class, an ``async`` function or a generator function.
    """
    if not callable(func):
        raise TypeError(f"{name}(...) decorates a callable, not {type(func).__name__}")
    if isinstance(func, type) and issubclass(func, models.Model):
        raise TypeError(
            f"{name}() got the model {func.__name__} as `using`; pass it as model={func.__name__}"
        )
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        raise TypeError(
            f"{name} cannot decorate the async function {getattr(func, '__qualname__', func)!r}: lockkit scopes "
            "are synchronous; decorate a plain def with @locked_operation and await its awaitable form, "
            "`await func.acall(...)`"
        )
    if inspect.isgeneratorfunction(func):
        raise TypeError(
            f"{name} cannot decorate the generator function {getattr(func, '__qualname__', func)!r}: its body "
            "would run after the scope has ended; collect the results in a list inside a plain function"
        )


@overload
def locked(using: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def locked(
    using: str | None = None,
    *,
    model: type[models.Model] | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
    statement_timeout: Duration | None = FROM_SETTINGS,
    nowait: bool = False,
    skip_locked: bool = False,
    no_key: bool = False,
) -> Locked: ...
def locked(
    using: Any = None,
    *,
    model: type[models.Model] | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
    statement_timeout: Duration | None = FROM_SETTINGS,
    nowait: bool = False,
    skip_locked: bool = False,
    no_key: bool = False,
) -> Any:
    """Open a locked scope: a transaction on one alias with transaction-scoped lock and statement timeouts.

    ``with locked("default") as scope:`` begins ``transaction.atomic(using=alias)`` (a savepoint when already in
    a transaction on that alias), sets ``lock_timeout``/``statement_timeout`` for that transaction only
    (``set_config(name, value, true)``), and yields a ``LockScope`` whose helpers lock rows on the same alias.
    Database failures leave the block as lockkit's typed errors. It never retries: use ``locked_operation`` for
    that. A nested scope restores the enclosing timeouts when it ends, with or without an error. See
    https://www.postgresql.org/docs/current/explicit-locking.html#LOCKING-ROWS and
    https://docs.djangoproject.com/en/stable/topics/db/transactions/.

    Args:
        using: The database alias; ``None`` means ``router.db_for_write(model)`` when ``model`` is given, else
            ``"default"``. (Used bare as ``@locked``, it decorates the function.)
        model: The model whose write database the scope uses when ``using`` is ``None``.
        lock_timeout: Seconds (``int``/``float``) or a ``timedelta`` a lock may be waited for, rounded to whole
            milliseconds; ``None`` leaves the connection's setting. Default ``settings.LOCKKIT["LOCK_TIMEOUT"]``
            (5 seconds).
        statement_timeout: Seconds or a ``timedelta`` any statement may run; ``None`` (default from
            ``settings.LOCKKIT["STATEMENT_TIMEOUT"]``, itself ``None``) leaves the connection's setting.
        nowait: Lock with ``NOWAIT``: a held row raises ``LockNotAvailable`` at once.
        skip_locked: Lock with ``SKIP LOCKED``: held rows are left out of the result.
        no_key: Lock with ``FOR NO KEY UPDATE`` (PostgreSQL), which does not block inserts referencing the row.

    Returns:
        A ``Locked`` context manager (also usable as a decorator, without retries) yielding a ``LockScope``.

    Raises:
        TypeError: a parameter has the wrong type (a ``bool`` or a string as a duration, a model instance).
        ValueError: an unknown alias, a non-positive/NaN/infinite duration, ``nowait`` with ``skip_locked``.
        django.db.NotSupportedError: on entry, the backend cannot honour ``nowait``/``skip_locked``/``no_key``.
        LockNotAvailable: inside the block, a row was locked and the scope asked for ``nowait``.
        LockTimeout: inside the block, a lock wait took longer than ``lock_timeout``.
        DeadlockDetected: the database aborted the transaction to break a deadlock.
        SerializationFailure: the database could not serialize the transaction (in the block or at commit).
        StatementTimeout: a statement ran longer than ``statement_timeout``.
        ReadOnlyDatabase: the alias is a read-only server (a hot standby).
    """
    options = ScopeOptions.build(
        None if callable(using) else using,
        model=model,
        lock_timeout=lock_timeout,
        statement_timeout=statement_timeout,
        nowait=nowait,
        skip_locked=skip_locked,
        no_key=no_key,
    )
    if callable(using):
        # ``@locked`` written bare decorates; locked() takes no alias resolver (locked_operation(using=...) does).
        if options != ScopeOptions():
            raise TypeError(f"using must be a database alias (str) or None, not {type(using).__name__}")
        return Locked(options)(using)
    return Locked(options)


__all__ = ["Locked", "ScopeBlock", "locked", "refuse_unsupported"]
