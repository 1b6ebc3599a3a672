"""``locked()``, ``locked_operation()``, ``LockScope`` and the stack of active scopes.

Configuration lives on the ``Locked``/decorator objects; every per-call value (the transaction, the timeouts to
restore, the attempt number) lives on the ``LockScope`` of that call, kept in a ``ContextVar`` stack (per thread and
per task). One decorated function is therefore safe to call from many threads at once.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from django.db import DatabaseError, connections, models, transaction
from django.db.models import QuerySet

from lockkit import aliases, conf
from lockkit.backends import TimeoutToken, backend_for
from lockkit.durations import seconds
from lockkit.errors import ERROR_FOR_FAILURE, LockError, NotInLockedScope, classify
from lockkit.retry import RetryPolicy, RetrySetting, call_with_retry, check_retry
from lockkit.sqlstate import code_of

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=models.Model)


class _Unset:
    def __repr__(self) -> str:
        return "<default from settings.LOCKKIT>"


_UNSET: Any = _Unset()


class _NotGiven:
    def __repr__(self) -> str:
        return "<not given>"


_NOT_GIVEN: Any = _NotGiven()

_scopes: ContextVar[tuple[LockScope, ...]] = ContextVar("lockkit_scopes", default=())


def _innermost_scope() -> LockScope | None:
    stack = _scopes.get()
    return stack[-1] if stack else None


def current_scope() -> LockScope:
    """Return the innermost active ``LockScope`` of this thread or task.

    Raises:
        NotInLockedScope: no ``locked()`` scope or ``locked_operation`` is active here.
    """
    scope = _innermost_scope()
    if scope is None:
        raise NotInLockedScope(
            "no locked() scope is active; open one with lockkit.locked() or @locked_operation"
        )
    return scope


def lock(target: QuerySet[M] | type[M]) -> QuerySet[M]:
    """Lock a queryset's rows in the innermost active scope: ``current_scope().lock(target)``.

    Raises:
        NotInLockedScope: no scope is active.
        AliasMismatch: the queryset is bound to another alias than the scope's.
        TypeError: ``target`` is neither a queryset nor a model class.
    """
    return current_scope().lock(target)


def _check_flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__}")
    return value


@dataclass(frozen=True)
class _Options:
    """A scope's validated configuration. ``lock_timeout``/``statement_timeout`` may be ``_UNSET`` (from settings)."""

    using: str | Callable[..., str] | None
    model: type[models.Model] | None
    lock_timeout: Any
    statement_timeout: Any
    nowait: bool
    skip_locked: bool
    no_key: bool

    @classmethod
    def build(
        cls,
        using: object,
        *,
        model: object,
        lock_timeout: object,
        statement_timeout: object,
        nowait: object,
        skip_locked: object,
        no_key: object,
        allow_callable: bool,
    ) -> _Options:
        if using is not None and not isinstance(using, str) and not (allow_callable and callable(using)):
            kinds = (
                "a database alias (str), a callable returning one,"
                if allow_callable
                else "a database alias (str)"
            )
            raise TypeError(f"using must be {kinds} or None, not {type(using).__name__}")
        if isinstance(using, str):
            aliases.check_alias(using)
        checked_model = aliases.check_model(model)
        if lock_timeout is not _UNSET:
            lock_timeout = seconds(lock_timeout, "lock_timeout", allow_none=True)
        if statement_timeout is not _UNSET:
            statement_timeout = seconds(statement_timeout, "statement_timeout", allow_none=True)
        nowait_ = _check_flag(nowait, "nowait")
        skip_locked_ = _check_flag(skip_locked, "skip_locked")
        no_key_ = _check_flag(no_key, "no_key")
        if nowait_ and skip_locked_:
            raise ValueError("nowait and skip_locked are mutually exclusive")
        return cls(
            using,
            checked_model,
            lock_timeout,
            statement_timeout,
            nowait_,
            skip_locked_,
            no_key_,
        )

    def timeouts(self) -> tuple[float | None, float | None]:
        """Resolve the timeouts in seconds, reading settings now (lazily, so ``override_settings`` applies)."""
        lock_timeout = self.lock_timeout
        if lock_timeout is _UNSET:
            lock_timeout = conf.resolved("LOCK_TIMEOUT", conf.DEFAULT_LOCK_TIMEOUT, _lock_timeout_setting)
        statement_timeout = self.statement_timeout
        if statement_timeout is _UNSET:
            statement_timeout = conf.resolved("STATEMENT_TIMEOUT", None, _statement_timeout_setting)
        return lock_timeout, statement_timeout

    def alias_for_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if callable(self.using):
            return aliases.check_alias(self.using(*args, **kwargs), "the alias returned by using(...)")
        return aliases.resolve(self.using, self.model)


def _lock_timeout_setting(value: object) -> float | None:
    return seconds(value, "LOCKKIT['LOCK_TIMEOUT']", allow_none=True)


def _statement_timeout_setting(value: object) -> float | None:
    return seconds(value, "LOCKKIT['STATEMENT_TIMEOUT']", allow_none=True)


def _retry_setting(value: object) -> RetrySetting:
    return check_retry(value, "LOCKKIT['RETRY']")


class LockScope:
    """One active locked scope: a transaction (or savepoint) on one alias, with its timeouts applied.

    Attributes:
        alias (str): The database alias every query of the scope runs on.
        attempt (int): The attempt number, 1 for the first (a ``locked_operation`` retry increments it).
        nowait (bool), skip_locked (bool), no_key (bool): The scope's locking options.
        lock_timeout (float | None), statement_timeout (float | None): The timeouts applied, in seconds.
        nested (bool): The scope began inside an existing transaction on its alias (it runs in a savepoint).
    """

    def __init__(self, options: _Options, alias: str, attempt: int) -> None:
        connection = connections[alias]
        backend = backend_for(connection)
        self.alias = alias
        self.attempt = attempt
        self.nowait = options.nowait
        self.skip_locked = options.skip_locked
        self.no_key = options.no_key
        self.lock_timeout, self.statement_timeout = options.timeouts()
        self.nested = _in_transaction(connection)
        # Checked here, before the transaction begins: an option the backend cannot honour runs no SQL.
        self._sfu_kwargs = backend.select_for_update_kwargs(
            connection, nowait=self.nowait, skip_locked=self.skip_locked, no_key=self.no_key
        )
        self._backend = backend
        self._atomic = transaction.atomic(using=alias)
        self._token: TimeoutToken = None
        self._active = False
        self._committed = (
            False  # set by the first commit hook: later errors come from callbacks, not the commit
        )
        self._owner: object = None  # the Locked or decorator call that opened the scope (it exits its own)

    def __repr__(self) -> str:
        return f"<LockScope alias={self.alias!r} attempt={self.attempt} nested={self.nested}>"

    # -- lifecycle -------------------------------------------------------------------------------------------

    def _enter(self) -> None:
        try:
            # The BEGIN itself may wait for a lock (SQLite's BEGIN IMMEDIATE): classify its failure too.
            self._backend.begin_transaction(
                connections[self.alias],
                self._atomic,
                lock_timeout=self.lock_timeout,
                statement_timeout=self.statement_timeout,
                nested=self.nested,
            )
        except BaseException as exc:
            self._reraise_classified(exc)
            raise
        try:
            self._token = self._backend.begin_scope(
                connections[self.alias],
                lock_timeout=self.lock_timeout,
                statement_timeout=self.statement_timeout,
                nested=self.nested,
            )
        except BaseException as exc:
            self._atomic.__exit__(type(exc), exc, exc.__traceback__)
            self._reraise_classified(exc)
            raise
        if not self.nested:
            # Registered first in a transaction this scope began, so it runs first after the COMMIT: if
            # atomic's exit then raises, the error is a later callback's, and the transaction is committed.
            transaction.on_commit(self._mark_committed, using=self.alias)
        self._active = True
        _scopes.set((*_scopes.get(), self))

    def _mark_committed(self) -> None:
        self._committed = True

    @property
    def committed(self) -> bool:
        """Whether the scope's own transaction has committed (only an outermost scope commits)."""
        return self._committed

    def _exit(self, exc: BaseException | None) -> None:
        self._active = False
        stack = _scopes.get()
        _scopes.set(tuple(s for s in stack if s is not self))
        connection = connections[self.alias]
        restore_error: BaseException | None = None
        # After an error swallowed inside the block the savepoint is rolled back anyway, which reverts the timeouts.
        if exc is None and self.nested and self._token and not connection.needs_rollback:
            try:
                self._backend.end_scope(connection, self._token)
            except BaseException as restore_exc:
                # Typically 25P02: the body swallowed a database error, so the savepoint cannot be released.
                # Roll it back and raise, as Django's own nested atomic() does; never lose the writes silently.
                exc = restore_error = restore_exc
        try:
            self._atomic.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        except BaseException as commit_exc:
            self._after_scope(pending=True)
            if self._committed:
                raise  # an on_commit callback failed after the COMMIT: not a failure of the transaction
            self._reraise_classified(commit_exc)
            raise
        self._after_scope(pending=exc is not None)
        if exc is not None:
            self._reraise_classified(exc)
            if restore_error is not None:
                raise restore_error

    def _after_scope(self, *, pending: bool) -> None:
        """Let the backend restore session settings a rollback does not revert (MySQL), after success or error.

        A failure to restore is raised when nothing else is; otherwise the scope's own error wins (the backend has
        already made sure the altered value cannot outlive the failure).
        """
        if self._token is None:
            return
        try:
            self._backend.after_scope(connections[self.alias], self._token, nested=self.nested)
        except BaseException:
            if not pending:
                raise

    def _reraise_classified(self, exc: BaseException) -> None:
        """Raise the typed lockkit error for a database failure, ``from`` the original; return for anything else."""
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
            attempts=self.attempt,
        )
        raise error from exc

    def _check_active(self) -> None:
        if not self._active or self not in _scopes.get():
            raise NotInLockedScope(
                f"{self!r} is not active in this thread or task; lock inside its with-block"
            )

    # -- locking helpers -------------------------------------------------------------------------------------

    def lock(self, target: QuerySet[M] | type[M]) -> QuerySet[M]:
        """Return ``target``'s rows as a ``select_for_update`` queryset on the scope's alias.

        The queryset is lazy: evaluate it inside the scope. Only the queried model's rows are locked
        (``of=("self",)``) where the backend supports it, so ``select_related()`` on a nullable foreign key works
        and leaves related rows unlocked. See
        https://docs.djangoproject.com/en/stable/ref/models/querysets/#select-for-update.

        Args:
            target: A queryset, or a model class (all its rows, through its default manager).

        Returns:
            A ``QuerySet`` with ``select_for_update(nowait=..., skip_locked=..., no_key=..., of=...)`` applied.

        Raises:
            NotInLockedScope: the scope is not active in this thread or task.
            AliasMismatch: the queryset is bound to another alias.
            TypeError: ``target`` is neither a queryset nor a model class.
        """
        self._check_active()
        kwargs = self._sfu_kwargs
        if "of" in kwargs:
            model = _model_of(target)
            parents = _parent_links(model) if model is not None else ()
            if parents:
                # A multi-table child's object is one row per table of its chain (inner joins): lock them all.
                kwargs = {**kwargs, "of": (*kwargs["of"], *parents)}
        return aliases.locking_queryset_on(target, self.alias, "target", **kwargs)

    def get(self, target: QuerySet[M] | type[M], *args: Any, **lookups: Any) -> M:
        """Lock and return the one row matching ``lookups`` (``QuerySet.get`` semantics), evaluated now.

        Raises:
            Model.DoesNotExist, Model.MultipleObjectsReturned: as ``QuerySet.get``.
            NotInLockedScope, AliasMismatch, TypeError: as ``lock()``.
        """
        return self.lock(target).get(*args, **lookups)

    def lock_all(self, target: QuerySet[M] | type[M], pks: Iterable[Any] | None = None) -> list[M]:
        """Lock rows in primary-key order, evaluated now, so that overlapping operations cannot deadlock.

        Args:
            target: A queryset or a model class.
            pks: Optional primary keys to restrict to; rows that do not exist are simply absent from the result.

        Returns:
            The locked rows as a list, in ascending primary-key order.

        Raises:
            TypeError: ``pks`` is a string or not iterable.
            NotInLockedScope, AliasMismatch: as ``lock()``.
        """
        queryset = self.lock(target)
        if isinstance(pks, QuerySet):
            # A subquery on the scope's alias (refused if bound elsewhere), not evaluated on another database.
            queryset = queryset.filter(pk__in=aliases.queryset_on(pks, self.alias, "pks"))
        elif pks is not None:
            if isinstance(pks, str | bytes) or not isinstance(pks, Iterable):
                raise TypeError(f"pks must be an iterable of primary keys, not {type(pks).__name__}")
            queryset = queryset.filter(pk__in=list(pks))
        return list(queryset.order_by("pk"))

    def on_commit(self, func: Callable[[], Any], robust: bool = False) -> None:
        """Run ``func`` after the outermost transaction on the scope's alias commits.

        Callbacks registered by an attempt that fails (or by a nested scope that rolls back) never run; those of
        the successful attempt run once. See
        https://docs.djangoproject.com/en/stable/topics/db/transactions/#performing-actions-after-commit.

        Raises:
            TypeError: ``func`` is not callable.
            NotInLockedScope: the scope is not active in this thread or task.
        """
        if not callable(func):
            raise TypeError(f"func must be callable, not {type(func).__name__}")
        _check_flag(robust, "robust")
        self._check_active()
        transaction.on_commit(func, using=self.alias, robust=robust)


def _model_of(target: object) -> type[models.Model] | None:
    if isinstance(target, type) and issubclass(target, models.Model):
        return target
    model = getattr(target, "model", None)  # a queryset or a manager; anything else is refused by aliases
    return model if isinstance(model, type) and issubclass(model, models.Model) else None


@functools.lru_cache(maxsize=512)
def _parent_links(model: type[models.Model], prefix: str = "") -> tuple[str, ...]:
    """The ``of=`` paths of a model's multi-table parents (``country_ptr``, ``country_ptr__entity_ptr``)."""
    paths: list[str] = []
    concrete = model._meta.concrete_model or model
    for parent, link in concrete._meta.parents.items():
        if link is None:  # pragma: no cover - only proxies have parents without a link, and they are resolved
            continue
        path = f"{prefix}{link.name}"
        paths += [path, *_parent_links(parent, f"{path}__")]
    return tuple(paths)


class Locked:
    """The object ``locked()`` returns: a context manager yielding a ``LockScope``, and a decorator.

    It holds only configuration; each ``with`` block gets its own ``LockScope``, so one ``Locked`` may be shared.
    """

    def __init__(self, options: _Options) -> None:
        self._options = options

    def __enter__(self) -> LockScope:
        alias = self._options.alias_for_call((), {})
        scope = LockScope(self._options, alias, attempt=1)
        scope._owner = self
        scope._enter()
        return scope

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The innermost scope this object opened: a generator or another alias's scope may have opened others
        # since, and exiting those instead would end the wrong transaction.
        for scope in reversed(_scopes.get()):
            if scope._active and scope._owner is self:
                scope._exit(exc)
                return
        raise NotInLockedScope("locked() exited without an active scope")  # pragma: no cover - misuse only

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        _refuse_async(func, "locked")

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return func(*args, **kwargs)

        return wrapper


def _refuse_async(func: object, name: str) -> None:
    if not callable(func):
        raise TypeError(f"{name}(...) decorates a callable, not {type(func).__name__}")
    if isinstance(func, type) and issubclass(func, models.Model):
        raise TypeError(
            f"{name}() got the model {func.__name__} as `using`; pass it as model={func.__name__}"
        )
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        raise TypeError(
            f"{name} cannot decorate the async function {getattr(func, '__qualname__', func)!r}: lockkit scopes "
            "are synchronous; call a sync locked operation through asgiref.sync.sync_to_async"
        )
    if inspect.isgeneratorfunction(func):
        raise TypeError(
            f"{name} cannot decorate the generator function {getattr(func, '__qualname__', func)!r}: its body "
            "would run after the scope has ended; collect the results in a list inside a plain function"
        )


def _in_transaction(connection: Any) -> bool:
    """Whether the connection is inside a transaction someone else began (``atomic`` or autocommit turned off)."""
    return bool(connection.in_atomic_block or not connection.get_autocommit())


class _Committed(BaseException):
    """Carries an error raised after an attempt committed (an ``on_commit`` callback) past the retry loop.

    A ``BaseException`` so that no retry predicate (``retry_if_exception_type()`` matches ``Exception``) retries
    work that is already committed.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


@overload
def locked(using: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def locked(
    using: str | None = None,
    *,
    model: type[models.Model] | None = None,
    lock_timeout: Any = _UNSET,
    statement_timeout: Any = _UNSET,
    nowait: bool = False,
    skip_locked: bool = False,
    no_key: bool = False,
) -> Locked: ...
def locked(
    using: Any = None,
    *,
    model: type[models.Model] | None = None,
    lock_timeout: Any = _UNSET,
    statement_timeout: Any = _UNSET,
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
        LockNotAvailable, LockTimeout, DeadlockDetected, SerializationFailure, StatementTimeout,
            ReadOnlyDatabase: the database reported that failure inside the block or at commit.
    """
    if callable(using) and _all_defaults(
        model, _UNSET, lock_timeout, statement_timeout, nowait, skip_locked, no_key
    ):
        return Locked(_DEFAULT_OPTIONS)(using)
    options = _Options.build(
        using,
        model=model,
        lock_timeout=lock_timeout,
        statement_timeout=statement_timeout,
        nowait=nowait,
        skip_locked=skip_locked,
        no_key=no_key,
        allow_callable=False,
    )
    return Locked(options)


class _LockedOperation:
    """The decorator ``locked_operation(...)`` returns; configuration only, no per-call state."""

    def __init__(self, options: _Options, retry: RetrySetting | _Unset) -> None:
        self._options = options
        self._retry = retry

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        _refuse_async(func, "locked_operation")
        options, retry_option = self._options, self._retry
        operation = getattr(func, "__qualname__", repr(func))

        def attempt(alias: str, number: int, args: Any, kwargs: Any) -> R:
            scope = LockScope(options, alias, number)
            scope._enter()
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                scope._exit(exc)
                raise
            try:
                scope._exit(None)
            except BaseException as exc:
                if scope.committed:
                    raise _Committed(exc) from exc
                raise
            return result

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            alias = options.alias_for_call(args, kwargs)
            retry = retry_option
            if isinstance(retry, _Unset):
                retry = conf.resolved("RETRY", _DEFAULT_POLICY, _retry_setting)
            try:
                if retry is None or _in_transaction(connections[alias]):
                    # Nested in an outer transaction (ATOMIC_REQUESTS included): a retry here would run inside
                    # the failed transaction, so make one attempt and let the owner of the transaction decide.
                    return attempt(alias, 1, args, kwargs)
                return call_with_retry(
                    retry,
                    lambda number: attempt(alias, number, args, kwargs),
                    alias=alias,
                    operation=operation,
                )
            except _Committed as committed:
                raise committed.error from None

        return wrapper


_DEFAULT_POLICY = RetryPolicy()
_DEFAULT_OPTIONS = _Options(None, None, _UNSET, _UNSET, False, False, False)


@overload
def locked_operation(using_or_func: Callable[P, R], /) -> Callable[P, R]: ...  # type: ignore[overload-overlap]
@overload
def locked_operation(
    using_or_func: str | Callable[..., str] | None = None,
    /,
    *,
    using: str | Callable[..., str] | None = None,
    model: type[models.Model] | None = None,
    retry: RetrySetting | _Unset = _UNSET,
    lock_timeout: Any = _UNSET,
    statement_timeout: Any = _UNSET,
    nowait: bool = False,
    skip_locked: bool = False,
    no_key: bool = False,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def locked_operation(
    using_or_func: Any = _NOT_GIVEN,
    /,
    *,
    using: Any = _NOT_GIVEN,
    model: type[models.Model] | None = None,
    retry: Any = _UNSET,
    lock_timeout: Any = _UNSET,
    statement_timeout: Any = _UNSET,
    nowait: bool = False,
    skip_locked: bool = False,
    no_key: bool = False,
) -> Any:
    """Decorate a function so each call runs in a locked scope, retried as a whole on transient failures.

    Each call resolves one alias (``using``, a callable of the call's arguments, ``router.db_for_write(model)``
    or ``"default"``) and runs the function inside ``locked(alias, ...)``; inside it, ``lockkit.current_scope()``
    and ``lockkit.lock()`` reach the scope. When the call owns the outermost transaction on that alias, a failure
    the retry policy lists rolls the transaction back and re-runs the whole function in a fresh one; nested in an
    outer ``atomic()`` (``ATOMIC_REQUESTS`` included) it makes exactly one attempt and raises the classified error,
    leaving the outer transaction usable. See
    https://www.postgresql.org/docs/current/mvcc-serialization-failure-handling.html.

    Args:
        using: An alias, ``None``, or (keyword ``using=``, or positional together with other options) a callable
            receiving the decorated function's arguments and returning the alias. Used bare as
            ``@locked_operation``, it decorates the function with every default.
        model: The model whose ``router.db_for_write`` gives the alias when ``using`` is ``None``.
        retry: A ``RetryPolicy``, a tenacity ``Retrying`` (copied per call, with ``reraise=True``) or ``None`` for
            no retries. Default ``settings.LOCKKIT["RETRY"]``, itself ``RetryPolicy()``.
        lock_timeout, statement_timeout, nowait, skip_locked, no_key: As for ``locked()``.

    Returns:
        A decorator; the decorated function returns what the function returns.

    Raises:
        TypeError: at decoration, a wrong parameter type or an ``async def`` function; at call, ``using`` returned
            something that is not a string.
        ValueError: at decoration, a bad value (see ``locked()``); at call, ``using`` returned an unknown alias.
        LockNotAvailable, LockTimeout, DeadlockDetected, SerializationFailure, StatementTimeout,
            ReadOnlyDatabase: the failure of the last attempt, with ``.attempts`` set.
    """
    if using_or_func is not _NOT_GIVEN and using is not _NOT_GIVEN:
        raise TypeError("locked_operation() got using both positionally and as a keyword")
    if (
        using is _NOT_GIVEN
        and callable(using_or_func)
        and _all_defaults(model, retry, lock_timeout, statement_timeout, nowait, skip_locked, no_key)
    ):
        return _LockedOperation(_DEFAULT_OPTIONS, _UNSET)(using_or_func)
    if using is _NOT_GIVEN:
        using = None if using_or_func is _NOT_GIVEN else using_or_func
    options = _Options.build(
        using,
        model=model,
        lock_timeout=lock_timeout,
        statement_timeout=statement_timeout,
        nowait=nowait,
        skip_locked=skip_locked,
        no_key=no_key,
        allow_callable=True,
    )
    checked_retry = retry if retry is _UNSET else check_retry(retry)
    return _LockedOperation(options, checked_retry)


def _all_defaults(*values: object) -> bool:
    model, retry, lock_timeout, statement_timeout, nowait, skip_locked, no_key = values
    return (
        model is None
        and retry is _UNSET
        and lock_timeout is _UNSET
        and statement_timeout is _UNSET
        and nowait is False
        and skip_locked is False
        and no_key is False
    )


__all__ = ["LockScope", "Locked", "current_scope", "lock", "locked", "locked_operation"]
