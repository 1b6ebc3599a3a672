"""``locked_update(queryset, change)``: lock one row, decide in Python, write it, commit; the whole call retried.

On PostgreSQL (psycopg 3, client-side binding) outside any transaction it is two messages through the engine's
``OneMessage``: the opening with the lock timeout and the locking ``SELECT ... FOR UPDATE OF <table>``, then
``UPDATE ... WHERE pk = ...; COMMIT``, both compiled by Django. Everywhere else it is the same operation in a
``locked_operation`` scope, with more round trips and the same results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.core.exceptions import EmptyResultSet, FieldError
from django.db import ProgrammingError, connections, models
from django.db.models.expressions import Combinable
from django.db.models.query import ModelIterable
from django.db.models.sql import UpdateQuery

from lockkit._engine import outcome
from lockkit._engine.attempts import in_messages
from lockkit._engine.message import OneMessage
from lockkit._engine.transaction import in_transaction
from lockkit.aio import awaitable
from lockkit.backends import backend_for
from lockkit.backends.sql import relations
from lockkit.backends.sql.rows import instances
from lockkit.errors import ConnectionLost, QueryInChange
from lockkit.operations.operation import locked_operation
from lockkit.retries import reconnect_budget, setting_for
from lockkit.scopes import aliases
from lockkit.scopes.options import FROM_SETTINGS, ScopeOptions
from lockkit.scopes.stack import current_scope
from lockkit.validation import milliseconds

M = TypeVar("M", bound=models.Model)


def locked_update(
    queryset: models.QuerySet[M],
    change: Callable[[M], Mapping[str, Any]],
    /,
    *,
    lock_timeout: Any = FROM_SETTINGS,
    nowait: bool = False,
    using: str | None = None,
    retry: Any = FROM_SETTINGS,
) -> M:
    """Lock the one row ``queryset`` matches, pass it to ``change``, write what it returns, and commit.

    ``change(row)`` receives the locked row as a model instance and returns the fields to write as a dict (or
    raises): ``locked_update(Stock.objects.filter(sku=sku), lambda row: {"available": row.available - n})``. On
    PostgreSQL (psycopg 3) outside any transaction this is **two messages**: ``BEGIN; SELECT set_config(...);
    SELECT ... FOR UPDATE OF <table>``, then ``UPDATE ... WHERE pk = ...; COMMIT`` (values bound by the driver, as
    Django binds them), so the row lock is held for one round trip plus ``change()``. Inside the caller's
    ``atomic()``, and on MariaDB/MySQL and SQLite, it is the same operation in a locked scope (more round trips,
    the same results); inside a transaction it is one attempt in a savepoint. No model signals are sent (as
    ``QuerySet.update()``); ``auto_now`` fields are not touched unless ``change`` returns them. When the database can
    evaluate the condition itself, ``lockkit.guarded_update`` is one message. See
    https://www.postgresql.org/docs/current/explicit-locking.html#LOCKING-ROWS.

    Deadlocks, serialization failures, lock timeouts (and NOWAIT failures, when the policy retries them) and a
    connection lost before ``COMMIT`` was sent re-run the whole call (``change()`` again, on the fresh row) per the
    retry policy. A reply to ``UPDATE ...; COMMIT`` that is lost is resolved from the server by transaction id:
    committed (the row is returned), rolled back (retried as a lost connection), or ``CommitOutcomeUnknown``.

    Args:
        queryset: A ``QuerySet`` matching exactly one row of a model without multi-table parents (the filter
            picks the row; no slicing, ``distinct()``, annotations, combinations, ``select_related()`` or
            ``prefetch_related()``).
        change: Called with the locked row (a model instance); returns ``{field name: value}`` to write (plain
            values, not expressions: the write happens after the decision). It must not run queries (refused
            with ``QueryInChange``). An exception it raises rolls back and propagates, never retried. It must
            have no side effects: it runs once per attempt, before the write commits, and on the two-message
            path with no Django transaction open (``transaction.on_commit()`` called there runs at once). Act
            on the returned row after the call.
        lock_timeout: Seconds (``int``/``float``/``timedelta``) the row lock may be waited for, ``None`` for the
            connection's own setting; default ``settings.LOCKKIT["LOCK_TIMEOUT"]``.
        nowait: Fail at once with ``LockNotAvailable`` when the row is locked (``FOR UPDATE NOWAIT``).
        using: The database alias; default: the queryset's own (``.using()``), else ``router.db_for_write``.
        retry: A ``lockkit.RetryPolicy``, a tenacity ``Retrying``, a dict of ``RetryPolicy`` fields or ``None``
            (no retries); default ``settings.LOCKKIT["RETRY"]``. Each attempt is a fresh transaction.

    Returns:
        The row as written: a model instance read back as the database stored it (``UPDATE ... RETURNING`` on
        PostgreSQL, a read in the same transaction elsewhere); the instance ``change`` saw when it returned
        nothing to write. An attribute ``change`` set on its row without returning it is not written (its
        primary key included: the row written is the row locked). After a lost reply to ``UPDATE ...; COMMIT``
        resolved as committed: the row as read with the fields ``change`` returned, as each field's
        ``to_python`` converts them (not read again: another writer may have changed the row since).

    Raises:
        TypeError: ``queryset`` is not a ``QuerySet``, ``change`` is not callable, an option has the wrong type;
            ``change`` returned something that is not a mapping, or an expression. The options are checked before
            any SQL; a bad return value rolls back.
        ValueError: a sliced, distinct, annotated, ``extra(select=...)``, combined, ``select_related()``/``prefetch_related()`` or
            ``values()`` queryset, a multi-table-inheritance model, a bad duration (before any SQL); ``change``
            returned an unknown field, the primary key or a field ``update()`` cannot set (rolled back).
        Model.DoesNotExist, Model.MultipleObjectsReturned: the queryset matched no row or several (rolled back).
        lockkit.errors.QueryInChange: ``change`` ran a statement on the alias (refused before it was sent).
        lockkit.errors.AliasMismatch: the queryset is bound (``.using()``) to another alias than ``using``.
        lockkit.errors.LockTimeout, lockkit.errors.LockNotAvailable: the row stayed locked (after the policy's
            attempts); nothing was written.
        lockkit.errors.DeadlockDetected, lockkit.errors.SerializationFailure: on every attempt the policy allows.
        lockkit.errors.ConnectionLost: the connection was lost before the ``COMMIT`` took effect, on every attempt.
        lockkit.errors.CommitOutcomeUnknown: the reply to ``UPDATE ...; COMMIT`` was lost and the server could not
            say whether it committed. Never retried.
        django.db.IntegrityError: the write broke a constraint; nothing was committed. Never retried.
    """
    alias = _checked(queryset, change, using)
    options = ScopeOptions.build(using=alias, lock_timeout=lock_timeout, nowait=nowait)
    policy = setting_for(retry)
    bound = queryset if queryset._db == alias else queryset.using(alias)  # type: ignore[attr-defined]
    connection = connections[alias]
    if (
        in_transaction(connection)
        or connection.execute_wrappers  # their own statements could not join a transaction sent as messages
        or not backend_for(connection).features.sends_one_message(connection)
    ):
        return _in_scope(bound, change, alias, options, policy)
    try:
        select = _locking_select(bound, alias, options.nowait)
    except EmptyResultSet:
        return _one(bound, [])
    lock, _ = options.timeouts()
    # The row the attempt read (its values) and the fields it wrote, should the reply be lost.
    decided: list[tuple[list[Any], dict[str, Any]]] = []

    def send(message: OneMessage) -> M:
        decided.clear()
        with connection.cursor() as cursor:
            found, _ = message.run(cursor, *select, commit=False)
            read = [list(values.values()) for values in found]
            try:
                row = _one(bound, instances(bound.model, alias, read))
                locked = row.pk  # the row written is the row locked, whatever change() does to the instance
                fields = _decided(change, row, alias)
                if not fields:
                    message.roll_back(cursor)
                    return row
                update = _update_statement(bound.model, alias, locked, fields)
            except BaseException:
                message.roll_back(cursor)
                raise
            decided.append((read[0], fields))
            written, _ = message.finish(cursor, *update)
        return _one(bound, instances(bound.model, alias, [list(values.values()) for values in written]))

    def resolve(message: OneMessage, lost: ConnectionLost) -> M:
        outcome.of_transaction(alias, message.xid, message.server, lost, within=reconnect_budget(policy))
        # Committed (of_transaction raises otherwise): the row as this call wrote it, not read again (another
        # writer may have changed it since its lock was released).
        # A new instance of the row as read, the fields written set as each field converts them (not the
        # instance change() saw, which it may have changed).
        read, fields = decided[0]
        row = instances(bound.model, alias, [read])[0]
        meta = bound.model._meta
        for name, value in fields.items():
            field = meta.get_field(name)
            if field.is_relation and name == field.name:
                setattr(row, name, value)  # an instance (or None), as change() gave it
            else:
                setattr(row, field.attname, field.to_python(value))  # type: ignore[union-attr]
        return row

    return in_messages(
        alias,
        policy,
        send,
        operation="lockkit.locked_update",
        timeouts={} if lock is None else {"lock_timeout": milliseconds(lock)},
        elsewhere=lambda: _in_scope(bound, change, alias, options, None),
        nowait=options.nowait,
        resolve=resolve,
        by_xid=True,
        observed_as=locked_update,
    )


alocked_update = awaitable(locked_update)
alocked_update.__doc__ = (
    """The awaitable form of ``locked_update`` (one thread and connection for the whole call)."""
)


def _checked(queryset: object, change: object, using: object) -> str:
    """The alias of a valid call; every check that needs no SQL."""
    if not isinstance(queryset, models.QuerySet):
        raise TypeError(f"queryset must be a QuerySet, not {type(queryset).__name__}")
    if not callable(change):
        raise TypeError(f"change must be callable, not {type(change).__name__}")
    query = queryset.query
    if query.is_sliced:
        raise ValueError("queryset: a sliced queryset cannot be updated; filter it down to one row")
    if query.distinct or query.distinct_fields or query.annotations or query.combinator or query.extra:
        raise ValueError(
            "queryset: filter the model's own rows (no distinct(), annotations, extra(select=...) or combinations)"
        )
    model = queryset.model
    if query.select_for_update:
        raise ValueError(
            "queryset: locked_update locks the row itself; pass the queryset without select_for_update()"
        )
    if query.select_related or queryset._prefetch_related_lookups:  # type: ignore[attr-defined]
        # The two-message path reads the model's own columns only: a related row read in change() would be a
        # query there (QueryInChange) and not elsewhere. One answer on every path, before any SQL.
        raise ValueError(
            "queryset: locked_update reads and locks the model's own row; drop select_related()/"
            "prefetch_related() (change() decides from the row's own fields; read related rows before the call)"
        )
    if queryset._iterable_class is not ModelIterable:
        raise ValueError(
            "queryset: a values()/values_list() queryset has no model instances; pass the model's queryset"
        )
    if (model._meta.concrete_model or model)._meta.parents:
        raise ValueError(
            f"queryset: {model.__name__} has multi-table parents; lock it with lockkit.locked() and save() it"
        )
    bound: str | None = queryset._db  # type: ignore[attr-defined]
    if using is None:
        alias = bound if bound is not None else aliases.resolve(None, model)
    else:
        alias = aliases.check_alias(using)
    aliases.check_queryset_alias(queryset, alias, "queryset", routed=using is None)
    return alias


def _decided(change: Callable[[M], Mapping[str, Any]], row: M, alias: str) -> dict[str, Any]:
    """Call ``change(row)`` with statements on ``alias`` refused; check and return the fields it chose."""
    refused: list[str] = []

    def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        refused.append(sql)
        raise QueryInChange(
            f"locked_update's change() ran a statement on {alias!r} while the row was locked; it must only "
            f"compute the new values from the row it is given (refused, not sent: {sql[:80]!r})",
            alias=alias,
        )

    try:
        with connections[alias].execute_wrapper(refuse):
            fields = change(row)
    except ProgrammingError as error:
        if isinstance(error, QueryInChange) or not _raised_by(error, connections[alias]):
            raise  # another alias's error is change()'s own (found by a review)
        # Another way in than a statement: atomic() (or a lockkit call opening one) on the two-message path,
        # where the row's transaction is lockkit's, not Django's, and the driver refuses to change autocommit.
        raise QueryInChange(
            f"locked_update's change() used the database on {alias!r} ({type(error).__name__}: {error}); it must "
            f"only compute the new values from the row it is given",
            alias=alias,
        ) from error
    connection = connections[alias]
    # change() closed the connection: the row's transaction is gone (inside atomic(), Django keeps the wrapper's
    # connection until the block ends and says so in closed_in_transaction, read here, never written).
    if connection.connection is None or connection.closed_in_transaction:
        raise QueryInChange(
            f"locked_update's change() closed the connection of {alias!r}; it must only compute the new values "
            f"(nothing was written)",
            alias=alias,
        )
    if refused:  # change() caught the refusal: the call fails all the same
        raise QueryInChange(
            f"locked_update's change() ran a statement on {alias!r}; it must only compute the new values",
            alias=alias,
        )
    if not isinstance(fields, Mapping):
        raise TypeError(f"change must return a dict of field names to values, not {type(fields).__name__}")
    meta = type(row)._meta
    checked: dict[str, Any] = {}
    seen: set[str] = set()
    by_name = {f.name: f for f in meta.concrete_fields} | {f.attname: f for f in meta.concrete_fields}
    if meta.pk is not None:
        by_name["pk"] = meta.pk
    for name, value in fields.items():
        field = by_name.get(name) if isinstance(name, str) else None
        if field is None:
            raise ValueError(f"change returned {name!r}, which is not a concrete field of {meta.object_name}")
        if field.primary_key or field in meta.pk_fields:  # a part of a CompositePrimaryKey too
            raise ValueError(f"change returned the primary key {name!r}; the locked row keeps its key")
        if getattr(field, "generated", False):  # GeneratedField (Django 5.0+): the database computes it
            raise ValueError(f"change returned {name!r}, a GeneratedField: the database computes it")
        if isinstance(value, Combinable) or hasattr(value, "resolve_expression"):
            raise TypeError(
                f"change returned an expression for {name!r}; return the value to write (the row is locked)"
            )
        if field.name in seen:
            raise ValueError(
                f"change returned {field.name!r} twice (as {field.name!r} and {field.attname!r})"
            )
        seen.add(field.name)
        checked[name] = (
            value  # as given: a foreign key by its name (an instance) or its attname (a key value)
        )
    return checked


def _raised_by(error: BaseException, connection: Any) -> bool:
    """Whether ``error`` came out of a method of ``connection`` (Django's connection object of the alias)."""
    trace = error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_locals.get("self") is connection:
            return True
        trace = trace.tb_next
    return False


def _reread(model: type[M], alias: str, pk: Any) -> M:
    """The row as the database has it now: in the call's transaction, or (a lost reply) after its commit."""
    return model._base_manager.db_manager(alias).get(pk=pk)


def _update_statement(
    model: type[models.Model], alias: str, pk: Any, fields: dict[str, Any]
) -> tuple[str, Any]:
    """``UPDATE <table> SET ... WHERE pk = %s RETURNING <columns>``: ``QuerySet.update(**fields)`` as Django compiles it.

    ``RETURNING`` the concrete columns (lockkit's own message, as ``guarded_update``'s) gives back the row as the
    database stored it, so the instance returned is what was written.

    Raises:
        ValueError: Django refused a field or value (``FieldError``).
    """
    query = UpdateQuery(model)
    try:
        query.add_update_values(fields)
    except FieldError as exc:
        raise ValueError(f"change: {exc}") from None
    query.add_q(models.Q(pk=pk))
    connection = connections[alias]
    sql, params = query.get_compiler(connection=connection).as_sql()
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(field.column)) for field in model._meta.concrete_fields)
    return f"{sql} RETURNING {columns}", params


def _locking_select(queryset: models.QuerySet[M], alias: str, nowait: bool) -> tuple[str, Any]:
    """``SELECT <concrete columns> ... LIMIT 2 FOR UPDATE [NOWAIT] OF <table>``: Django's compiler, then its clause.

    The ``SELECT`` is what the queryset compiles to (values as parameters); the locking clause is the backend's
    own ``for_update_sql()`` naming only the model's table (an alias for a schema-qualified one), as Django writes
    it for ``select_for_update(of=("self",))``.

    Raises:
        EmptyResultSet: no row can match (``pk__in=[]``).
    """
    model = queryset.model
    selection = queryset.values_list(*(field.attname for field in model._meta.concrete_fields))[:2]
    query = selection.query
    base = query.get_initial_alias()
    assert base is not None
    if relations.is_qualified(model, alias):
        base = relations.alias_base_table(query)
    connection = connections[alias]
    compiler = query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    of = (relations.quote_as_from_clause(compiler, base),)
    return f"{sql} {connection.ops.for_update_sql(nowait=nowait, of=of)}", params


def _one(queryset: models.QuerySet[M], rows: list[M]) -> M:
    meta = queryset.model._meta
    if not rows:
        raise queryset.model.DoesNotExist(f"{meta.object_name} matching query does not exist.")  # type: ignore[attr-defined]
    if len(rows) > 1:
        raise _several(queryset)
    return rows[0]


def _several(queryset: models.QuerySet[Any]) -> Exception:
    error: Exception = queryset.model.MultipleObjectsReturned(
        f"the queryset matched more than one {queryset.model._meta.object_name}; locked_update changes exactly one row"
    )
    return error


def _in_scope(
    queryset: models.QuerySet[M],
    change: Callable[[M], Mapping[str, Any]],
    alias: str,
    options: ScopeOptions,
    policy: Any,
) -> M:
    """The same operation in a locked scope: a locking ``get()``, ``change()``, ``QuerySet.update()``."""
    model = queryset.model
    # The whole row is read (change() must not load a deferred field: that would be a query), as the locking
    # SELECT of the two-message path reads it (values_list() of every concrete column).
    queryset = queryset.defer(None)

    def work() -> M:
        scope = current_scope()
        try:
            row = scope.get(queryset)
        except model.MultipleObjectsReturned:  # type: ignore[attr-defined]
            raise _several(queryset) from None
        locked = row.pk  # the row written is the row locked, whatever change() does to the instance
        fields = _decided(change, row, alias)
        if not fields:
            return row
        model._base_manager.db_manager(alias).filter(pk=locked).update(**fields)
        return _reread(model, alias, locked)  # as written (converted by the database), in the transaction

    # Named as the public call in signals, logs and notes (not this helper's closure).
    work.__module__, work.__qualname__, work.__name__ = "lockkit", "locked_update", "locked_update"
    lock: Any = options.lock_timeout
    operation = locked_operation(using=alias, lock_timeout=lock, nowait=options.nowait, retry=policy)
    return operation(work)()
