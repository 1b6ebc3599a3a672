"""``guarded_update(queryset, **changes)``: the queryset's filter is the guard of one ``UPDATE ... RETURNING``.

On PostgreSQL outside any transaction the statement travels with its opening and ``COMMIT`` in one message (the
claims' ``OneMessage``); inside the caller's transaction, and on MariaDB/MySQL, it runs in a ``locked_operation``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.core.exceptions import EmptyResultSet, FieldDoesNotExist, FieldError
from django.db import connections, models
from django.db.models.query import ModelIterable
from django.db.models.sql import UpdateQuery
from django.db.models.sql.compiler import SQLUpdateCompiler

from lockkit._engine.attempts import in_messages
from lockkit._engine.message import OneMessage
from lockkit._engine.transaction import in_transaction
from lockkit.backends import backend_for
from lockkit.backends.sql.rows import instances
from lockkit.operations.operation import locked_operation
from lockkit.retries import check_retry, setting_for
from lockkit.scopes import aliases
from lockkit.scopes.options import FROM_SETTINGS, Default, ScopeOptions
from lockkit.scopes.stack import current_scope
from lockkit.validation import milliseconds

M = TypeVar("M", bound=models.Model)

#: Keyword-only options of ``guarded_update``: a model field of one of these names cannot be a change.
OPTIONS = frozenset({"using", "lock_timeout", "statement_timeout", "retry"})

_Statement = tuple[str, list[Any]]


def guarded_update(
    queryset: models.QuerySet[M],
    /,
    *,
    using: str | None = None,
    lock_timeout: Any = FROM_SETTINGS,
    statement_timeout: Any = FROM_SETTINGS,
    retry: Any = FROM_SETTINGS,
    **changes: Any,
) -> list[M]:
    """Update the rows ``queryset`` matches with ``changes`` and return them as updated, in one statement.

    The queryset's filter is the guard: ``guarded_update(Stock.objects.filter(pk=sku, available__gte=n),
    available=F("available") - n)`` either takes ``n`` units or, when too few are left, updates nothing and returns
    ``[]``. PostgreSQL re-checks the guard on the newest version of each row after any lock wait, so concurrent
    calls never oversell. On PostgreSQL outside any transaction the statement is sent as one message,
    ``BEGIN; SELECT set_config('lock_timeout', ...); UPDATE ... WHERE <filter> RETURNING <columns>; COMMIT``:
    the row lock is held for a single round trip. Values are bound client-side by psycopg, as for any statement.
    Inside the caller's ``atomic()`` (or a lockkit scope) on the same alias the ``UPDATE`` runs in a savepoint of
    the caller's transaction with the timeouts applied for its duration, and is never retried. On SQLite it is one
    ``UPDATE ... RETURNING`` in a locked scope; on MariaDB/MySQL (no ``UPDATE ... RETURNING``) the matching rows are
    locked in primary-key order (``SELECT ... FOR UPDATE``), updated (the guard still in the ``WHERE``) and re-read,
    in one locked scope. See https://www.postgresql.org/docs/current/sql-update.html.

    A guard on a related model's field (a join) is compiled by Django as ``pk IN (subquery)``: PostgreSQL re-checks
    only the updated table's own columns after a lock wait, so keep guards on the updated model's own fields.

    Args:
        queryset: A ``QuerySet`` of the model to update; its filter is the guard. No slicing, ``distinct()``,
            annotations, ``union()``-style combinations, and no changes to a parent model's fields (multi-table
            inheritance).
        using: The database alias; default: the queryset's own (``.using()``), else ``router.db_for_write``.
        lock_timeout: Seconds (``int``/``float``/``timedelta``) a lock may be waited for, ``None`` for the
            connection's own setting; default ``settings.LOCKKIT["LOCK_TIMEOUT"]``.
        statement_timeout: Seconds the statement may run, or ``None``; default
            ``settings.LOCKKIT["STATEMENT_TIMEOUT"]``.
        retry: A ``lockkit.RetryPolicy``, a tenacity ``Retrying``, a dict of ``RetryPolicy`` fields or ``None``
            (no retries); default ``settings.LOCKKIT["RETRY"]``. Each attempt is a fresh transaction.
        **changes: Field name to value or expression (``F()``, ``Value``...), as ``QuerySet.update(**kwargs)``. A
            field named ``using``, ``lock_timeout``, ``statement_timeout`` or ``retry`` cannot be changed here (the
            name is the option's): use ``QuerySet.update()`` in a ``lockkit.locked()`` scope.

    Returns:
        The updated rows as model instances with their new values (all concrete fields), in no particular order;
        ``[]`` when the guard matched nothing.

    Raises:
        TypeError: ``queryset`` is not a ``QuerySet``; an option has the wrong type.
        ValueError: no changes; an unknown field or one ``update()`` cannot set, the primary key or a
            ``GeneratedField``; a sliced, distinct, annotated,
            combined, ``extra(select=...)`` or ``values()``/``values_list()`` queryset; a duration that is not positive and finite. Raised before any SQL runs.
        lockkit.errors.AliasMismatch: the queryset is bound (``.using()``) to another alias than ``using``.
        lockkit.errors.LockTimeout: a row lock was waited for longer than ``lock_timeout`` (SQLSTATE 55P03);
            nothing was written. Retried when the policy retries lock timeouts.
        lockkit.errors.DeadlockDetected: a deadlock on every attempt the policy allows (40P01).
        lockkit.errors.StatementTimeout: the statement ran longer than ``statement_timeout`` (57014).
        lockkit.errors.ConnectionLost: the connection was lost, or the server refused it, before the statement was
            sent, on every attempt for the policy's ``reconnect_within`` seconds (5 by default).
        lockkit.errors.CommitOutcomeUnknown: the connection was lost after the message (with its ``COMMIT``) was
            sent: the update may have committed. Not retried.
        django.db.IntegrityError: the update broke a constraint; nothing was written.
    """
    alias = _checked(queryset, using, changes)
    options = ScopeOptions.build(using=alias, lock_timeout=lock_timeout, statement_timeout=statement_timeout)
    policy = retry if isinstance(retry, Default) else check_retry(retry)
    bound = queryset if queryset._db == alias else queryset.using(alias)  # type: ignore[attr-defined]
    connection = connections[alias]
    # A multi-table child's rows span its parents' tables: one UPDATE ... RETURNING cannot return them whole.
    inherited = bool((bound.model._meta.concrete_model or bound.model)._meta.parents)
    if connection.vendor == "postgresql" and not inherited:
        return _on_postgresql(bound, alias, options, policy, changes)
    returning = (
        connection.vendor == "sqlite" and connection.features.can_return_columns_from_insert and not inherited
    )

    def work() -> list[M]:
        if returning:
            statement = _statement(bound, alias, changes)
            return [] if statement is None else _run_returning(bound, alias, statement)
        return _locked_fallback(bound, alias, changes)

    return _operation(alias, options, policy, work)


def _checked(queryset: object, using: object, changes: dict[str, Any]) -> str:
    """The alias of a valid call; every check that needs no SQL."""
    if not isinstance(queryset, models.QuerySet):
        raise TypeError(f"queryset must be a QuerySet, not {type(queryset).__name__}")
    if not changes:
        raise ValueError("changes: give at least one field=value to update (guarded_update(qs, field=value))")
    query = queryset.query
    if query.is_sliced:
        raise ValueError("queryset: a sliced queryset cannot be updated (UPDATE has no LIMIT/OFFSET)")
    if query.distinct or query.distinct_fields:
        raise ValueError("queryset: a distinct() queryset cannot be updated")
    if query.annotations:
        raise ValueError(
            "queryset: an annotated queryset cannot be updated; filter on the model's own fields"
        )
    if query.combinator:
        raise ValueError(f"queryset: a {query.combinator}() queryset cannot be updated")
    if query.extra:
        raise ValueError(
            "queryset: extra(select=...) columns cannot be returned; filter on the model's own fields"
        )
    if queryset._iterable_class is not ModelIterable:
        raise ValueError(
            "queryset: a values()/values_list() queryset has no model instances to return; pass the model's queryset"
        )
    model = queryset.model
    for name in changes:
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:
            raise ValueError(f"changes: {model.__name__} has no field {name!r}") from None
        if not getattr(field, "concrete", False) or field.many_to_many or field.one_to_many:
            raise ValueError(f"changes: {model.__name__}.{name} is not a concrete field update() can set")
        if field.primary_key or field in model._meta.pk_fields:
            # The rows are returned by their keys where the database cannot return them from the UPDATE.
            raise ValueError(
                f"changes: {model.__name__}.{name} is the primary key; a guarded update keeps it"
            )
        if getattr(field, "generated", False):  # Django's update() would drop it without a word
            raise ValueError(
                f"changes: {model.__name__}.{name} is a GeneratedField; the database computes it"
            )
        if field.model is not model._meta.concrete_model:
            raise ValueError(
                f"changes: {model.__name__}.{name} belongs to the parent model {field.model.__name__}; "
                "a guarded update writes one table"
            )
    try:  # Django's own checks of the names and values (no SQL), as queryset.update() makes them
        cast(UpdateQuery, query.chain(UpdateQuery)).add_update_values(changes)
    except FieldError as exc:
        raise ValueError(f"changes: {exc}") from None
    bound: str | None = queryset._db  # type: ignore[attr-defined]
    if using is None:
        alias = bound if bound is not None else aliases.resolve(None, model)
    else:
        alias = aliases.check_alias(using)
    aliases.check_queryset_alias(queryset, alias, "queryset", routed=using is None)
    return alias


def _statement(queryset: models.QuerySet[Any], alias: str, changes: dict[str, Any]) -> _Statement | None:
    """``UPDATE ... SET ... WHERE <filter> RETURNING <concrete columns>``, compiled by Django; ``None``: no rows.

    The ``UPDATE`` is exactly what ``queryset.update(**changes)`` sends (Django's ``SQLUpdateCompiler``).

    Raises:
        ValueError: Django refused a change (``FieldError``).
    """
    query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))
    try:
        query.add_update_values(changes)
    except FieldError as exc:
        raise ValueError(f"changes: {exc}") from None
    compiler = query.get_compiler(alias)
    assert isinstance(compiler, SQLUpdateCompiler)  # UpdateQuery's compiler
    try:
        compiler.pre_sql_setup()
        sql, params = compiler.as_sql()
    except EmptyResultSet:
        return None
    except FieldError as exc:
        raise ValueError(f"changes: {exc}") from None
    if not sql:
        return None
    quote = connections[alias].ops.quote_name
    columns = ", ".join(quote(field.column) for field in queryset.model._meta.concrete_fields)
    return f"{sql} RETURNING {columns}", list(params)


def _run_returning(queryset: models.QuerySet[M], alias: str, statement: _Statement) -> list[M]:
    sql, params = statement
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return instances(queryset.model, alias, rows)


def _locked_fallback(queryset: models.QuerySet[M], alias: str, changes: dict[str, Any]) -> list[M]:
    """Lock the matching rows in primary-key order, update them (guard kept), re-read them: in the caller's scope."""
    scope = current_scope()
    pks = list(scope.lock(queryset.order_by("pk")).values_list("pk", flat=True))
    if not pks:
        return []
    try:
        queryset.filter(pk__in=pks).update(**changes)
    except FieldError as exc:
        raise ValueError(f"changes: {exc}") from None
    manager = queryset.model._base_manager.db_manager(alias)
    return list(manager.filter(pk__in=pks).order_by("pk"))


def _operation(alias: str, options: ScopeOptions, policy: Any, work: Callable[[], list[M]]) -> list[M]:
    lock: Any = options.lock_timeout  # validated; FROM_SETTINGS stays the settings default
    statement: Any = options.statement_timeout
    operation = locked_operation(using=alias, lock_timeout=lock, statement_timeout=statement, retry=policy)
    return operation(work)()


def _on_postgresql(
    queryset: models.QuerySet[M], alias: str, options: ScopeOptions, policy: Any, changes: dict[str, Any]
) -> list[M]:
    statement = _statement(queryset, alias, changes)
    if statement is None:
        return []
    connection = connections[alias]
    backend = backend_for(connection)
    # An execute wrapper may run statements of its own around ours (an audit): they could not join a transaction
    # that travels in one message, so with one installed the update runs in a scope, as claims do.
    if (
        in_transaction(connection)
        or connection.execute_wrappers
        or not backend.features.sends_one_message(connection)
    ):
        return _operation(alias, options, policy, lambda: _run_returning(queryset, alias, statement))
    lock, timed = options.timeouts()
    timeouts = {
        name: milliseconds(value)
        for name, value in (("lock_timeout", lock), ("statement_timeout", timed))
        if value is not None
    }
    sql, params = statement

    def send(message: OneMessage) -> list[M]:
        with connection.cursor() as cursor:
            rows, _ = message.run(cursor, sql, params)
        return instances(queryset.model, alias, [list(row.values()) for row in rows])

    return in_messages(
        alias,
        setting_for(policy),  # its own, else settings.LOCKKIT["RETRY"], as locked operations read it
        send,
        operation="lockkit.guarded_update",
        timeouts=timeouts,
        elsewhere=lambda: _operation(
            alias, options, None, lambda: _run_returning(queryset, alias, statement)
        ),
        timed=timed is not None,
        observed_as=guarded_update,
    )
