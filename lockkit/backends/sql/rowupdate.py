"""One row's ``UPDATE <table> SET ... WHERE <pk> = %s``, compiled once per model, alias and set of fields.

``Model.save(update_fields=...)`` of a saved row runs Django's update compiler on every call, and
``LockScope.save_with_commit()`` runs it inside the row lock's hold, where every waiter pays for it. What it
produces depends only on the model, the alias and the fields written, so a ``Plan`` keeps the statement's text and
the fields, and each call only prepares the values as Django does (``field.pre_save(instance, False)``, then
``field.get_db_prep_save``). A plan exists only for the plain case ``Model.save()`` compiles to one ``UPDATE`` with
one ``%s`` per field: a model that neither overrides ``save()``/``save_base()`` nor has multi-table parents, a
composite primary key, generated or ``db_returning`` fields, fields with their own placeholder
(``get_placeholder``), ``select_on_save`` or private fields (generic relations); ``update_fields`` naming only
concrete non-primary-key fields. Everything else is ``None``: the caller then runs ``instance.save()`` itself. Every
value stays a parameter. See https://docs.djangoproject.com/en/stable/ref/models/instances/#how-django-knows-to-update-vs-insert.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connections, models

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

_MAX_PLANS = 512
_NOT_PLANNED = object()


@dataclass(frozen=True)
class Plan:
    """A compiled row ``UPDATE``.

    Attributes:
        sql: ``UPDATE "table" SET "a" = %s, ... WHERE "table"."pk" = %s``.
        fields: The fields written, in the statement's order.
        update_fields: What ``pre_save``/``post_save`` receive as ``update_fields`` (``None``: all fields).
        pk: The primary-key field.
        relations: The model's concrete relation fields (``save()`` first checks their cached related objects).
    """

    sql: str
    fields: tuple[models.Field[Any, Any], ...]
    update_fields: frozenset[str] | None
    pk: models.Field[Any, Any]
    relations: tuple[models.Field[Any, Any], ...]

    def plain(self, instance: models.Model) -> bool:
        """Whether ``save()`` of ``instance`` is this plan.

        Not when a field is deferred (``update_fields=None`` then saves only the loaded ones) or a related object is
        cached (``save()`` checks it, and may take its primary key).
        """
        if self.update_fields is None and instance.get_deferred_fields():
            return False
        return not any(f.is_cached(instance) for f in self.relations)  # type: ignore[attr-defined]

    def params(self, instance: models.Model, connection: BaseDatabaseWrapper) -> list[Any] | None:
        """The statement's parameters for ``instance``, prepared as Django's ``save()`` prepares them.

        ``None`` when a value is an expression (``F()``, a subquery...), which Django compiles into the text: the
        caller then saves through Django. ``field.pre_save`` runs here, as in ``save()`` after ``pre_save``.
        """
        values: list[Any] = []
        for field in self.fields:
            value = field.pre_save(instance, False)
            if hasattr(value, "resolve_expression"):
                return None
            values.append(field.get_db_prep_save(value, connection=connection))
        values.append(self.pk.get_db_prep_value(instance.pk, connection, prepared=False))
        return values


_plans: dict[Hashable, Any] = {}
_lock = threading.Lock()


def plan_for(model: type[models.Model], alias: str, update_fields: Iterable[str] | None) -> Plan | None:
    """The plan of ``model``'s row ``UPDATE`` on ``alias`` writing ``update_fields`` (``None``: every field).

    Returns:
        ``None`` where Django's ``save()`` would do more, or other, than one plain ``UPDATE`` (see the module), or
        refuse ``update_fields`` (then Django's own ``save()`` raises its error).
    """
    if update_fields is None:
        fields_key: frozenset[str] | None = None
    else:
        if isinstance(update_fields, str):
            return None  # Django's save() reads a string as its characters and refuses them
        try:
            fields_key = frozenset(update_fields)
        except TypeError:
            return None
        if not fields_key:
            return None  # save() does nothing at all, not even send pre_save
    key = (model, alias, fields_key)
    found = _plans.get(key, _NOT_PLANNED)
    if found is _NOT_PLANNED:
        found = _compile(model, alias, fields_key)
        with _lock:
            if len(_plans) >= _MAX_PLANS:
                _plans.clear()
            _plans[key] = found
    return found  # type: ignore[no-any-return]


def _compile(model: type[models.Model], alias: str, update_fields: frozenset[str] | None) -> Plan | None:
    concrete = model._meta.concrete_model or model
    meta = concrete._meta
    if (
        model.save is not models.Model.save
        or model.save_base is not models.Model.save_base
        or meta.parents
        or meta.auto_created
        or meta.select_on_save
        or meta.private_fields
        or isinstance(meta.pk, models.CompositePrimaryKey)
    ):
        return None
    pk = meta.pk
    assert pk is not None
    writable = [f for f in meta.local_concrete_fields if f is not pk]
    if any(
        f.generated or getattr(f, "db_returning", False) or hasattr(f, "get_placeholder") for f in writable
    ):
        return None
    if update_fields is not None:
        names = {f.name for f in writable} | {f.attname for f in writable}
        if not update_fields <= names:
            return None  # Django's save() raises its ValueError
        writable = [f for f in writable if f.name in update_fields or f.attname in update_fields]
    if not writable:
        return None
    columns = [f.column for f in writable]
    if pk.column is None or None in columns:
        return None
    qn = connections[alias].ops.quote_name
    table = qn(meta.db_table)
    assignments = ", ".join(f"{qn(column)} = %s" for column in columns if column is not None)
    sql = f"UPDATE {table} SET {assignments} WHERE {table}.{qn(pk.column)} = %s"
    relations = tuple(f for f in meta.concrete_fields if f.is_relation)
    return Plan(sql=sql, fields=tuple(writable), update_fields=update_fields, pk=pk, relations=relations)
