"""``LockScope.save_with_commit``: the row's ``UPDATE`` and the scope's ``COMMIT`` in one message, the last statement.

``instance.save()`` runs as usual (``update_fields`` checked by Django, ``pre_save``/``post_save`` sent) under one
``connection.execute_wrapper()`` hook of the scope's: it sends the first ``UPDATE`` of the instance's table with the
``COMMIT`` in the same message (the backend's ``with_commit``: values bound client-side), and from then on refuses
every statement on the alias with ``StatementAfterCommit`` before it is sent, until the scope ends. Where the
backend cannot (or the scope does not own the outermost transaction, or the model has multi-table parents, whose
save is several ``UPDATE``s) it is a plain ``save()`` with the same last-statement rule, and the scope commits at
its end. On the one-message path, a model whose ``save()`` is one plain ``UPDATE`` (``rowupdate.Plan``) is saved
from its compiled statement, with ``pre_save``/``post_save`` sent here as ``save()`` sends them, so Django's update
compiler does not run inside the row lock's hold. See https://docs.djangoproject.com/en/stable/topics/db/instrumentation/ and
https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-MULTI-STATEMENT.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, models
from django.db.models import signals as model_signals

from lockkit import cancellation
from lockkit.backends.sql import rowupdate
from lockkit.errors import ConnectionLost, RowNotLocked, StatementAfterCommit
from lockkit.scopes import unlocked

if TYPE_CHECKING:
    from lockkit.scopes.transaction import ScopeTransaction

Row = tuple[type[models.Model], Any]


# Recorded as the pk of a model whose rows the scope handed out as a lazy locking queryset (``scope.lock()``).
ANY_ROW = object()


def row_of(model: type[models.Model], pk: Any) -> Row:
    """The key a scope records a locked row under: its concrete model and primary key."""
    return (model._meta.concrete_model or model, pk)


class Ending(contextlib.ExitStack):
    """What a scope closes when it ends, after its ``save_with_commit()``: the ``Final`` wrapper.

    Attributes:
        used: A statement of the save went through (``False``: the save was refused before any, nothing happened).
    """

    used = True


class Final:
    """The scope's last statement, as an execute wrapper: the save's ``UPDATE`` (with ``COMMIT``), then nothing.

    Attributes:
        sent: The ``UPDATE`` has been handed to the driver together with the ``COMMIT``.
        done: The driver returned from it: the transaction committed.
        exact: The compiled statement to send with the ``COMMIT`` (``None``: the first ``UPDATE`` of the table).
    """

    def __init__(
        self, alias: str, prefix: str | None, render: Callable[[str, Any], tuple[str, Any]] | None
    ) -> None:
        """Watch for the ``UPDATE`` starting with ``prefix`` (``None``: a plain save), rendered by ``render``."""
        self._alias = alias
        self._prefix = prefix
        self._render = render
        self.saving = True
        self.sent = False
        self.done = False
        self.exact: str | None = None
        self.statements = 0

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        """Send the save's ``UPDATE`` with the ``COMMIT``; pass the save's other statements; refuse later ones."""
        if not self.saving or self.sent:
            raise StatementAfterCommit(self._refusal(sql), alias=self._alias)
        self.statements += 1
        prefix, render = self._prefix, self._render
        if (
            prefix is None
            or render is None
            or many
            or not isinstance(sql, str)
            or not (sql is self.exact if self.exact is not None else sql.startswith(prefix))
        ):
            return execute(sql, params, many, context)  # a pre_save receiver's statement, or a plain save
        self._prefix = None  # one UPDATE only
        text, bound = render(sql, params)
        self.sent = True
        result = execute(text, bound, many, context)
        self.done = True
        return result

    def _refusal(self, sql: object) -> str:
        head = sql.split(None, 1)[0].upper() if isinstance(sql, str) and sql.strip() else "a statement"
        when = (
            "its UPDATE was sent with the COMMIT, so the transaction has already committed"
            if self.sent
            else "it is the scope's last statement (the scope commits when it ends)"
        )
        return (
            f"{head} refused on {self._alias!r} after save_with_commit(): {when}; the statement was not sent. Run "
            "every other statement of the scope before save_with_commit() (post_save receivers and code after it "
            "in the scope may not query this database), or use save() instead"
        )


def check(scope_alias: str, locked_rows: Iterable[Collection[Row]], instance: object) -> None:
    """Refuse, before any SQL, what ``save_with_commit`` cannot save.

    Raises:
        TypeError: ``instance`` is not a model instance, or is unsaved.
        RowNotLocked: the row was not locked by the active scopes on the alias.
    """
    if not isinstance(instance, models.Model):
        raise TypeError(f"instance must be a saved model instance, not {type(instance).__name__}")
    model = type(instance)
    if instance.pk is None or instance._state.adding:
        raise TypeError(
            f"instance must be a saved {model.__name__} (save_with_commit() updates a row the scope locked); "
            "this one has not been saved"
        )
    key = row_of(model, instance.pk)
    recorded = list(locked_rows)
    if any(key in rows for rows in recorded):
        return
    lazily = (key[0], ANY_ROW)
    if (
        any(lazily in rows for rows in recorded)
        and unlocked.recorded(scope_alias, model, instance.pk) is not False
    ):
        return
    raise RowNotLocked(
        f"{model._meta.label} pk={instance.pk!r} was not locked in this scope on {scope_alias!r}: "
        "save_with_commit() is for a row the scope locked (scope.get(), scope.lock_all(), scope.lock())",
        alias=scope_alias,
    )


def save(
    scope_alias: str,
    transaction_: ScopeTransaction,
    instance: models.Model,
    update_fields: Iterable[str] | None,
    stack: Ending,
    cursor: Any = None,
) -> None:
    """Save ``instance`` (``check`` passed) as the scope's last statement, its wrapper entered on ``stack``.

    ``cursor``: a Django cursor of the scope's alias to send a compiled ``UPDATE`` on (``None``: one is opened).

    When the save raised before any statement was sent (Django refused ``update_fields``), the wrapper is removed
    again: nothing happened, and the scope may still save.

    Raises:
        As ``LockScope.save_with_commit``.
    """
    if update_fields is not None and not isinstance(update_fields, str | Collection):
        with contextlib.suppress(TypeError):  # not iterable: Django's save() raises its own error
            update_fields = tuple(update_fields)  # a generator is read once, here, for both paths
    model = type(instance)
    connection = connections[scope_alias]
    backend = transaction_.backend
    prefix: str | None = None
    render: Callable[[str, Any], tuple[str, Any]] | None = None
    concrete = model._meta.concrete_model or model  # a proxy's parents are its concrete model: one table
    if (
        not transaction_.nested
        and not concrete._meta.parents
        and backend.commit_in_message_possible(connection)
    ):
        table = connection.ops.quote_name(model._meta.db_table)
        prefix = f"UPDATE {table} SET "

        def render(sql: str, params: Any) -> tuple[str, Any]:
            return backend.with_commit(connection, sql, params)

    waiting = None if transaction_.nested else cancellation.current()
    if (
        prefix is not None and waiting is not None and not waiting.begin_commit()
    ):  # the message carries the COMMIT
        raise cancellation.CallCancelled(
            f"the awaiting caller was cancelled before save_with_commit() on {scope_alias!r}"
        )
    plan = rowupdate.plan_for(model, scope_alias, update_fields) if prefix is not None else None
    if plan is not None and (instance._state.db != scope_alias or not plan.plain(instance)):
        plan = None
    final = Final(scope_alias, prefix, render)
    stack.enter_context(connection.execute_wrapper(final))
    callbacks = transaction_.pending_callbacks() if prefix is not None else []
    try:
        with transaction_.translating:
            if plan is None:
                instance.save(using=scope_alias, update_fields=update_fields)
            else:
                _save_planned(scope_alias, connection, plan, instance, final, cursor)
    except DatabaseError as error:
        final.saving = False
        if final.done:  # UPDATE; COMMIT returned: committed, whatever a receiver raised after it
            transaction_.committed_in_message = True
            raise
        if final.sent and isinstance(error, ConnectionLost):
            transaction_.resolve_in_message(error, callbacks)  # returns only when it committed
            return
        transaction_.doom(error)
        raise
    except BaseException:
        final.saving = False
        if final.done:
            transaction_.committed_in_message = True
        elif not final.statements:
            stack.close()
            stack.used = False
        raise
    final.saving = False
    transaction_.committed_in_message = final.sent


def _save_planned(
    alias: str, connection: Any, plan: rowupdate.Plan, instance: models.Model, final: Final, cursor: Any
) -> None:
    """``instance.save(update_fields=...)`` from ``plan``: the signals as ``save()`` sends them, one ``UPDATE``.

    A value that is an expression is left to Django (``save()`` before ``pre_save``; after it, when a receiver set
    one, the queryset's ``update()`` of the same fields).

    Raises:
        DatabaseError: the ``UPDATE`` matched no row (``Model.NotUpdated`` on Django 6, as ``save(update_fields=...)``
            raises); the transaction had committed with it.
    """
    if any(hasattr(instance.__dict__.get(f.attname), "resolve_expression") for f in plan.fields):
        instance.save(using=alias, update_fields=plan.update_fields)
        return
    origin = type(instance)
    final.exact = plan.sql
    model_signals.pre_save.send(
        sender=origin, instance=instance, raw=False, using=alias, update_fields=plan.update_fields
    )
    params = plan.params(instance, connection)
    if params is None:  # a pre_save receiver set an expression: Django compiles it
        final.exact = None
        updated = (
            origin._base_manager.using(alias)
            .filter(pk=instance.pk)
            .update(**{f.attname: f.pre_save(instance, False) for f in plan.fields})
        )
    else:
        with contextlib.nullcontext(cursor) if cursor is not None else connection.cursor() as sending:
            sending.execute(plan.sql, params)
            updated = sending.rowcount
    if not updated:
        # Django 6's save() raises the model's NotUpdated (a DatabaseError) here; 5.2 a plain DatabaseError.
        not_updated: type[DatabaseError] = getattr(origin, "NotUpdated", DatabaseError)
        raise not_updated(
            f"save_with_commit() of {origin._meta.label} pk={instance.pk!r} did not affect any rows (as "
            "save(update_fields=...) says: the row was deleted in this scope); the transaction committed without it"
        )
    model_signals.post_save.send(
        sender=origin,
        instance=instance,
        created=False,
        update_fields=plan.update_fields,
        raw=False,
        using=alias,
    )
