"""``LockScope``: one active locked scope and its helpers (``get``, ``lock``, ``lock_all``, ``advisory_lock``, ``on_commit``...).

Configuration lives on the ``Locked``/decorator objects (a frozen ``ScopeOptions``); every per-call value (the
transaction, the timeouts, the attempt number) lives on the ``LockScope`` of that call, kept in a ``ContextVar``
stack (per thread and per task). One decorated function is therefore safe to call from many threads at once. The
transaction itself is ``lockkit._engine.transaction.ScopeTransaction``; ``locked_operation`` is in ``lockkit.operations.operation``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from django.core.exceptions import ValidationError
from django.db import DatabaseError, connections, models, transaction
from django.db.models import QuerySet

from lockkit import events, signals
from lockkit._engine import commits
from lockkit._engine.transaction import ScopeTransaction
from lockkit.advisory import held as advisory_locks
from lockkit.advisory.held import HeldLock
from lockkit.advisory.keys import AdvisoryKeyLike, advisory_key
from lockkit.backends.sql import relations
from lockkit.conf import advisory_namespace
from lockkit.errorcodes import table as codes
from lockkit.errorcodes.translate import translating
from lockkit.errors import Failure, LockError, NotInLockedScope
from lockkit.scopes import aliases, unlocked
from lockkit.scopes.options import ScopeOptions
from lockkit.scopes.stack import innermost_scope, scopes
from lockkit.tablemodes import TableLockMode, table_lock_mode, table_models
from lockkit.validation import flag

P = ParamSpec("P")
R = TypeVar("R")
if TYPE_CHECKING:
    # Without django-stubs ``models.Model`` is ``Any`` to a type checker, and a model class (a subclass of Any)
    # matches every arm of ``QuerySet[M] | type[M] | M``: mypy solves M as ``Never``. A PEP 696 default makes the
    # result ``Any`` there instead (typing_extensions: annotations only, Python 3.11 has no ``default=``); with
    # django-stubs M is still the model (``scope.get(Job, pk=1)`` is ``Job``).
    from typing_extensions import TypeVar as _TypeVarWithDefault

    M = _TypeVarWithDefault("M", bound=models.Model, default=Any)
else:
    M = TypeVar("M", bound=models.Model)


def classify(exc: BaseException, *, nowait: bool | None = None, timed: bool | None = None) -> Failure | None:
    """Say which locking failure an exception reports, from the SQLSTATE or vendor code on its chain.

    The code is read from the exception and its ``__cause__``/``__context__`` chain, so Django-wrapped and bare
    driver errors (psycopg 3, psycopg2, mysqlclient, sqlite3, oracledb) classify alike. PostgreSQL reports both a
    ``NOWAIT`` failure and an expired ``lock_timeout`` as SQLSTATE 55P03 (``lock_not_available``). An error the
    server's lock timer raised is always ``Failure.LOCK_TIMEOUT`` (NOWAIT covers row locks only, so a NOWAIT
    statement can wait for a table lock; see ``lockkit.errorcodes.table.timer_fired``). Otherwise ``nowait`` tells them apart:
    when it is ``None``, the innermost active lockkit scope's ``nowait`` option decides, and
    outside any scope the error is reported by the code's own name (``Failure.LOCK_NOT_AVAILABLE`` for 55P03 and
    ORA-00054, ``Failure.LOCK_TIMEOUT`` for MariaDB's 1205, which MariaDB also raises for ``NOWAIT``). SQLSTATE
    57014 is ``Failure.STATEMENT_TIMEOUT`` inside a scope that set a statement timeout, else
    ``Failure.QUERY_CANCELED``. A lost connection (class 08, 57P01..., MariaDB 2006/2013...) is
    ``Failure.CONNECTION_LOST``. See https://www.postgresql.org/docs/current/errcodes-appendix.html.

    Args:
        exc: Any exception.
        nowait: Whether the failing statement used ``NOWAIT``; ``None`` to take it from the active scope.
        timed: Whether a statement timeout was set for the failing statement; ``None`` to take it from the
            active scope.

    Returns:
        The ``Failure`` kind, or ``None`` when the exception is not a locking failure lockkit knows.

    Raises:
        TypeError: ``exc`` is not an exception, or ``nowait`` is not a ``bool`` or ``None``.
    """
    scope = innermost_scope()
    if nowait is None:
        nowait = None if scope is None else scope.nowait
    if timed is None:
        timed = None if scope is None else scope.statement_timeout is not None
    return codes.classify(exc, nowait=nowait, timed=timed)


class LockScope:
    """One active locked scope: a transaction (or savepoint) on one alias, with its timeouts applied.

    Attributes:
        alias (str): The database alias every query of the scope runs on.
        attempt (int): The attempt number, 1 for the first (a ``locked_operation`` retry increments it).
        nowait (bool), skip_locked (bool), no_key (bool): The scope's locking options.
        lock_timeout (float | None), statement_timeout (float | None): The timeouts applied, in seconds.
        nested (bool): The scope began inside an existing transaction on its alias (it runs in a savepoint).
    """

    def __init__(
        self, options: ScopeOptions, alias: str, attempt: int, *, resolve_within: float | None = None
    ) -> None:
        """Prepare a scope; ``ScopeBlock`` opens it. Validates the options against the backend, runs no SQL.

        Raises:
            django.db.NotSupportedError: the backend cannot honour ``nowait``/``skip_locked``/``no_key``.
        """
        self.alias = alias
        self.attempt = attempt
        self.nowait = options.nowait
        self.skip_locked = options.skip_locked
        self.no_key = options.no_key
        self.lock_timeout, self.statement_timeout = options.timeouts()
        self._transaction = ScopeTransaction(
            alias,
            lock_timeout=self.lock_timeout,
            statement_timeout=self.statement_timeout,
            nowait=self.nowait,
            attempt=attempt,
            resolve_within=resolve_within,
        )
        self.nested = self._transaction.nested
        # Checked here, before the transaction begins: an option the backend cannot honour runs no SQL. Django may
        # ask the server for its version first (MariaDB, on a connection's first use): a refusal is ConnectionLost.
        with translating(alias, nowait=self.nowait, attempts=attempt):
            self._sfu_kwargs = self._transaction.backend.features.select_for_update_kwargs(
                self._transaction._connection,
                nowait=self.nowait,
                skip_locked=self.skip_locked,
                no_key=self.no_key,
            )
        self._active = False
        # The other aliases that commit while this scope is open (lockkit._engine.commits).
        self._attempt = commits.Attempt(alias)
        # Advisory locks the transaction does not release by itself (MariaDB's GET_LOCK): released at scope end.
        self._advisory: list[HeldLock] = []
        # DEBUG / lockkit's pytest plugin only: the record of locked rows that UnlockedSaveWarning is checked against.
        self._watch = unlocked.Watch(alias, options.model) if unlocked.enabled() else None

    def __repr__(self) -> str:
        """Show the alias, the attempt and whether the scope is nested."""
        return f"<LockScope alias={self.alias!r} attempt={self.attempt} nested={self.nested}>"

    @property
    def committed(self) -> bool:
        """Whether the scope's own transaction has committed (only an outermost scope commits)."""
        return self._transaction.committed

    @property
    def committed_elsewhere(self) -> tuple[str, ...]:
        """The other aliases on which work committed while this scope was open, in order.

        Work committed there (a scope, ``locked_update``, ``guarded_update`` or a claims call on that alias) stays
        committed whatever this scope does; a ``locked_operation`` never retries an attempt during which this
        happened.
        """
        return self._attempt.elsewhere

    def _check_active(self) -> None:
        if not self._active or all(block.scope is not self for block in scopes.get()):
            raise NotInLockedScope(
                f"{self!r} is not active in this thread or task; lock inside its with-block"
            )

    # -- locking helpers -------------------------------------------------------------------------------------

    def lock(self, target: QuerySet[M] | type[M] | M) -> QuerySet[M]:
        """Return ``target``'s rows as a ``select_for_update`` queryset on the scope's alias.

        The queryset is lazy: evaluate it inside the scope. Only the queried model's rows are locked
        (``of=("self",)``) where the backend supports it, so ``select_related()`` on a nullable foreign key works
        and leaves related rows unlocked. A model that a database router sends to another alias is refused, as is
        a queryset bound to another alias: either would lock rows outside this transaction. See
        https://docs.djangoproject.com/en/stable/ref/models/querysets/#select-for-update and
        https://docs.djangoproject.com/en/stable/topics/db/multi-db/.

        Args:
            target: A queryset; a model class (all its rows, through its default manager); or a saved model
                instance (its own row, looked up by primary key).

        Returns:
            A ``QuerySet`` with ``select_for_update(nowait=..., skip_locked=..., no_key=..., of=...)`` applied.

        Raises:
            NotInLockedScope: the scope is not active in this thread or task.
            AliasMismatch: the queryset or instance is bound to another alias, or ``router.db_for_write`` sends
                the model to another alias (an explicit ``.using(scope.alias)`` is accepted). No SQL has run.
            TypeError: ``target`` is not a queryset, a model class or a model instance.
            ValueError: ``target`` is an unsaved instance.
        """
        return self._locking(target)

    def _locking(self, target: QuerySet[M] | type[M] | M) -> QuerySet[M]:
        """``lock()`` without the record of a lazily locked model (``get``/``lock_all`` record their rows)."""
        self._check_active()
        kwargs = self._sfu_kwargs
        if "of" in kwargs:
            model = _model_of(target)
            if model is not None:
                # A multi-table child's object is one row per table of its chain (inner joins): lock them all.
                kwargs = {**kwargs, "of": (*kwargs["of"], *_parent_links(model))}
                if relations.is_qualified(model, self.alias):
                    # FOR UPDATE OF takes unqualified names only: lock a schema-qualified table through an alias.
                    queryset = aliases.queryset_on(
                        target, self.alias, "target", instances=True, routed=True
                    ).all()
                    relations.alias_base_table(queryset.query)
                    return queryset.select_for_update(**kwargs)
        # One clone of the caller's queryset: select_for_update() on it, bound to the scope's alias.
        return aliases.locking_queryset_on(
            target, self.alias, "target", instances=True, routed=True, **kwargs
        )

    def get(self, target: QuerySet[M] | type[M] | M, /, *args: Any, **lookups: Any) -> M:
        """Lock and return the one row matching ``lookups`` (``QuerySet.get`` semantics), evaluated now.

        Given a model instance, its row is read again under the lock and returned as a new object (the instance
        passed in is left as it was): ``account = scope.get(account)``.

        Raises:
            Model.DoesNotExist, Model.MultipleObjectsReturned: as ``QuerySet.get`` (an instance whose row has
                been deleted raises ``DoesNotExist``).
            NotInLockedScope, AliasMismatch, TypeError, ValueError: as ``lock()``.
            ValueError: a lookup value the field cannot convert (as ``QuerySet.get``; also an infinite float
                for an integer field, where Django lets ``OverflowError`` escape), before any SQL.
            django.core.exceptions.FieldError: a lookup names a field the model does not have (as
                ``QuerySet.get``), before any SQL.
            LockError: the database failed (``LockTimeout``, ``DeadlockDetected``, ``ConnectionLost``...): typed,
                and the scope's block is marked for rollback (see ``lock_all``).
        """
        queryset = _filtered(self._locking(target), "lookups", *args, **lookups)
        with self._evaluating():
            if not signals.lock_acquired.receivers:
                row = queryset.get()
            else:
                row = events.timed_lock(LockScope, self, queryset.model, lambda: queryset.get(), _one)
        return row

    def lock_all(self, target: QuerySet[M] | type[M], pks: Iterable[Any] | None = None) -> list[M]:
        """Lock rows in primary-key order, evaluated now, so that overlapping operations cannot deadlock.

        The locks are always taken in ascending primary-key order (one ``SELECT ... ORDER BY pk FOR UPDATE``),
        whatever order ``pks`` lists them in; the rows are then returned in the order of ``pks``, so
        ``payer, payee = scope.lock_all(Account, pks=[payer_id, payee_id])`` holds for any two ids.

        Args:
            target: A queryset or a model class.
            pks: The primary keys of the rows to lock, in the order the result should have (a key listed twice
                gives its row twice). ``None``: every row of ``target``, in primary-key order. A queryset (of
                primary keys, on the scope's alias) is a subquery: its rows come in primary-key order and
                absent keys are not reported.

        Returns:
            The locked rows as a list: in the order of ``pks`` when it is an iterable of keys, else in ascending
            primary-key order.

        Raises:
            Model.DoesNotExist: a key of ``pks`` matched no row (the message names every such key); the rows
                that exist are locked until the scope ends.
            TypeError: ``pks`` is a string or not iterable.
            ValueError: a key of ``pks`` is not a valid value of the primary key field (an infinite float for an
                integer key too), before any SQL.
            NotInLockedScope, AliasMismatch: as ``lock()``.
            LockError: the database failed (``LockTimeout``, ``DeadlockDetected``, ``ConnectionLost``...). The
                error is typed and marks the scope's block for rollback, as Django does for a failed ``save()``:
                the scope rolls back and ends with that error even if the body catches it (no partial commit on
                any vendor; InnoDB rolls the whole transaction back on a deadlock and carries on in a new one).
        """
        queryset = self._locking(target)
        if pks is None:
            return self._locked_rows(queryset.order_by("pk"))
        if isinstance(pks, QuerySet):
            # A subquery on the scope's alias (refused if bound elsewhere), not evaluated on another database.
            return self._locked_rows(
                queryset.filter(pk__in=aliases.queryset_on(pks, self.alias, "pks")).order_by("pk")
            )
        if isinstance(pks, str | bytes) or not isinstance(pks, Iterable):
            raise TypeError(f"pks must be an iterable of primary keys, not {type(pks).__name__}")
        model: Any = queryset.model
        wanted = [_primary_key(model, pk) for pk in pks]
        rows = {row.pk: row for row in self._locked_rows(queryset.filter(pk__in=wanted).order_by("pk"))}
        missing = [pk for pk in wanted if pk not in rows]
        if missing:
            missing = _match_by_collation(rows, wanted, missing)
        if missing:
            raise model.DoesNotExist(
                f"lock_all: no {model.__name__} with pk {', '.join(map(repr, dict.fromkeys(missing)))} "
                f"on {self.alias!r}"
            )
        return [rows[pk] for pk in wanted]

    @contextlib.contextmanager
    def _evaluating(self) -> Iterator[None]:
        """Run a helper's query: a database failure is typed, and dooms the block even if the body catches it.

        As Django marks ``save()`` failures for rollback: InnoDB rolls the whole transaction back on a deadlock
        and runs later statements in a new one, so a body that caught the error and carried on would otherwise
        commit half a transaction. The scope then rolls back and ends with this error.
        """
        try:
            with self._transaction.translating:
                yield
        except DatabaseError as error:
            self._transaction.doom(error)
            raise

    def _locked_rows(self, queryset: QuerySet[M]) -> list[M]:
        """Evaluate a locking queryset; timed for ``lockkit.signals.lock_acquired`` only when it has receivers.

        A database failure is typed and dooms the scope's block (``_evaluating``).
        """
        with self._evaluating():
            if not signals.lock_acquired.receivers:
                rows = list(queryset)
            else:
                rows = events.timed_lock(LockScope, self, queryset.model, lambda: list(queryset), len)
        return rows

    def advisory_lock(self, key: AdvisoryKeyLike, *, shared: bool = False) -> HeldLock:
        """Take an advisory (named) lock, held until the scope's transaction ends, honouring its timeout options.

        PostgreSQL: ``pg_advisory_xact_lock`` (``_shared`` with ``shared``), released by the end of the outermost
        transaction (or the rollback of the scope's savepoint); with the scope's ``nowait``,
        ``pg_try_advisory_xact_lock``. MariaDB/MySQL: ``GET_LOCK`` with the scope's ``lock_timeout``, released
        when the scope ends on every path (a nested scope that succeeds hands it to the enclosing scope), so it
        never stays on a pooled connection. SQLite: the scope's ``BEGIN IMMEDIATE`` write lock already excludes
        every other scope, so it covers every key. Inside a ``locked_operation`` a ``LockTimeout`` is retried like
        a row lock's. See https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADVISORY-LOCKS.

        Args:
            key: An ``int`` (signed 64-bit), a ``str`` (hashed to 64 bits, in ``settings.LOCKKIT["ADVISORY_NAMESPACE"]``
                when it is set) or a ``(namespace, key)`` pair.
            shared: Take a shared lock (PostgreSQL): shared holders exclude exclusive ones, not each other.

        Returns:
            The ``HeldLock`` (alias, key with its 64-bit value, server session id).

        Raises:
            TypeError, ValueError: a bad key or flag, or (``lockkit.conf.SettingTypeError``/``SettingValueError``)
                a bad ``settings.LOCKKIT["ADVISORY_NAMESPACE"]``, before any SQL runs.
            NotInLockedScope: the scope is not active in this thread or task.
            django.db.NotSupportedError: before any SQL runs, ``shared`` on MariaDB/MySQL, or on SQLite a scope
                nested in a transaction that does not hold the write lock.
            LockNotAvailable: the scope has ``nowait`` and another session holds the key (the message names the
                key and the holder's server session id; the scope is doomed: it ends with this error even if the
                body catches it).
            LockTimeout: the key was not granted within the scope's ``lock_timeout`` (named and doomed alike).
        """
        checked = advisory_key(key, namespace=advisory_namespace())
        flag(shared, "shared")
        self._check_active()
        backend = self._transaction.backend
        backend.locks.check_advisory(connections[self.alias], shared=shared, session=False)
        # A lock the transaction does not release (MariaDB's GET_LOCK) is the scope's to release as soon as it is
        # granted, before take() returns (an interrupt in between would strand it).
        record = None if backend.features.advisory_locks_end_with_transaction else self._advisory.append

        def take() -> HeldLock:
            return advisory_locks.take(
                self.alias,
                checked,
                shared=shared,
                session=False,
                nowait=self.nowait,
                lock_timeout=self.lock_timeout,
                attempts=self.attempt,
                record=record,
            )

        try:
            held = (
                take()
                if not signals.lock_acquired.receivers
                else events.timed_lock(LockScope, self, None, take, _one)
            )
        except LockError as error:
            # A refusal dooms the block, as a row lock's does, even if the body catches it.
            self._transaction.doom(error)
            raise
        return held

    def lock_table(
        self,
        model: type[models.Model] | str,
        /,
        *models_: type[models.Model] | str,
        mode: TableLockMode | str,
        nowait: bool | None = None,
    ) -> None:
        """Lock whole tables in ``mode`` until the scope's transaction ends (``LOCK TABLE ... IN <mode> MODE``).

        For the decisions a row lock cannot protect: "no new row may appear while I count them" (``SHARE`` keeps
        every writer out, other ``SHARE`` holders and readers go on) or "nobody writes this table while I rebuild
        it" (``EXCLUSIVE``: only plain reads go on). The lock is part of the scope's transaction: a nested scope's
        lock is kept by the enclosing transaction when the nested scope succeeds and given back with its savepoint
        when it fails; nothing is held after the outermost scope ends. The wait is bounded by the scope's
        ``lock_timeout``; with ``nowait`` a table another session holds in a conflicting mode fails at once.
        Several tables are locked in one statement, in the order of their table names whatever order they are
        given in, so two scopes that lock the same tables cannot deadlock on them. Inside a ``locked_operation`` a
        ``LockTimeout`` is retried like a row lock's. See
        https://www.postgresql.org/docs/current/explicit-locking.html#LOCKING-TABLES and
        https://www.postgresql.org/docs/current/sql-lock.html.

        PostgreSQL: ``LOCK TABLE``, every mode, partitions and inheritance children included. SQLite: the scope's
        ``BEGIN IMMEDIATE`` write lock already keeps every other writer out, which covers every mode but
        ``ACCESS EXCLUSIVE`` (no SQL is sent). MariaDB/MySQL: refused, as ``LOCK TABLES`` commits the open
        transaction and outlives it.

        Args:
            model: A model class or an ``"app_label.ModelName"`` string (as ``pglock.model`` takes). A proxy
                model locks its concrete model's table; an unmanaged model the table its ``db_table`` names; a
                multi-table child its own table only (pass its parents too to lock theirs).
            *models_: More models, locked in the same statement (each table once).
            mode: A ``TableLockMode`` or its name as a string (``"SHARE ROW EXCLUSIVE"``; any case, spaces or
                underscores; ``pglock.SHARE`` and the other pglock constants are such strings).
            nowait: Fail at once instead of waiting (``LOCK TABLE ... NOWAIT``); ``None`` (default): the scope's
                own ``nowait``.

        Raises:
            TypeError: a model is an instance or not a model at all; ``mode`` is not a string; ``nowait`` is
                not a ``bool`` or ``None``. Before any SQL runs.
            ValueError: ``mode`` names no table lock mode; a string names no installed model; an abstract or
                swapped model. Before any SQL runs.
            NotInLockedScope: the scope is not active in this thread or task.
            AliasMismatch: a router sends a model's writes to another alias than the scope's. No SQL has run.
            django.db.NotSupportedError: before any SQL runs, on MariaDB/MySQL, or on SQLite ``ACCESS
                EXCLUSIVE`` or a scope nested in a transaction that does not hold the write lock.
            LockNotAvailable: with ``nowait``, another session holds a table in a conflicting mode.
            LockTimeout: a table was not granted within the scope's ``lock_timeout``. Like every database
                error of the scope's helpers, it marks the scope's block for rollback.
        """
        checked_mode = table_lock_mode(mode)
        targets = table_models((model, *models_))
        wait_free = self.nowait if nowait is None else flag(nowait, "nowait")
        self._check_active()
        for target in targets:
            aliases.check_routed(target, self.alias, "model")
        connection = connections[self.alias]
        backend = self._transaction.backend
        backend.locks.check_table_lock(connection, checked_mode)
        quote = connection.ops.quote_name
        # Each table once (two models may share one: a proxy, unmanaged models), in name order.
        by_table: dict[str, type[models.Model]] = {}
        for target in targets:
            by_table.setdefault(quote(target._meta.db_table), target)
        tables = sorted(by_table)

        def take() -> None:
            backend.locks.lock_tables(connection, tables, checked_mode, nowait=wait_free)

        try:
            with translating(
                self.alias,
                nowait=wait_free,
                attempts=self.attempt,
                timed=self.statement_timeout is not None,
            ):
                if not signals.lock_acquired.receivers:
                    take()
                else:
                    events.timed_lock(LockScope, self, by_table[tables[0]], take, _no_rows)
        except DatabaseError as error:
            self._transaction.doom(error)
            raise

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
        flag(robust, "robust")
        self._check_active()
        # The outermost lockkit transaction on the alias keeps the record (its savepoints drop what they undo);
        # inside a transaction lockkit did not begin, Django's own list is all there is.
        outermost = next(
            (b.scope for b in scopes.get() if b.scope.alias == self.alias and not b.scope.nested), None
        )
        if outermost is None:
            transaction.on_commit(func, using=self.alias, robust=robust)
        else:
            outermost._transaction.callbacks.register(self.alias, func, robust=robust)


def _filtered(queryset: QuerySet[M], name: str, /, *args: Any, **lookups: Any) -> QuerySet[M]:
    """``queryset.filter(...)``, with a value Django cannot convert raised as ``ValueError`` naming ``name``.

    Django raises ``TypeError``/``ValueError`` for most such values but lets ``OverflowError`` escape from
    ``int(float("inf"))``; nothing has been sent either way.
    """
    try:
        return queryset.filter(*args, **lookups)
    except ArithmeticError as exc:  # OverflowError, decimal.InvalidOperation
        raise ValueError(f"{name}: {exc}") from None


def _one(_: object) -> int:
    return 1


def _no_rows(_: object) -> int:
    return 0  # a table lock locks no rows


def _match_by_collation(rows: dict[Any, Any], wanted: list[Any], missing: list[Any]) -> list[Any]:
    """Match text keys the database found under a case-insensitive collation (MariaDB's default); return the rest.

    A row whose key equals no requested key exactly was found through the column's collation (``"A"`` found
    ``"a"``): it is matched back to the requested key that differs only by case.
    """
    exact = set(wanted)
    spare = {key.casefold(): row for key, row in rows.items() if isinstance(key, str) and key not in exact}
    for pk in missing:
        if isinstance(pk, str) and pk.casefold() in spare:
            rows[pk] = spare[pk.casefold()]
    return [pk for pk in missing if pk not in rows]


def _primary_key(model: type[models.Model], value: Any) -> Any:
    """``value`` as the primary key field stores it (``"7"`` -> ``7``), so rows can be matched back to ``pks``.

    Raises:
        ValueError: the field cannot hold ``value`` (Django's ``ValidationError`` names why).
    """
    field = model._meta.pk
    assert field is not None
    if value is None:  # to_python(None) is None, which pk__in drops: it would only surface as DoesNotExist
        raise ValueError(
            f"pks: None is not a valid {model.__name__} primary key: a primary key is never NULL"
        )
    try:
        return field.to_python(value)
    except ValidationError as exc:
        raise ValueError(
            f"pks: {value!r} is not a valid {model.__name__} primary key: {exc.messages[0]}"
        ) from None
    except ArithmeticError as exc:  # int(float("inf")): OverflowError, which Django lets escape
        raise ValueError(f"pks: {value!r} is not a valid {model.__name__} primary key: {exc}") from None


def _model_of(target: object) -> type[models.Model] | None:
    if isinstance(target, type) and issubclass(target, models.Model):
        return target
    if isinstance(target, models.Model):
        return type(target)
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
