"""``Claim``: the frozen value a worker holds for one claimed row, and presents to every later write.

Also ``stale_reason``: why a claim no longer holds its row, in words for ``StaleClaim``'s message.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar

from django.conf import settings
from django.db import connections
from django.db.models import Field

from lockkit._engine.message import Row
from lockkit.claims.mixin import Claimable
from lockkit.claims.sql.base import fetched_column

M = TypeVar("M", bound=Claimable)


@dataclass(frozen=True)
class Claim:
    """One claimed row: which row, the fencing token, and the lease, as the database recorded them.

    A ``Claim`` is plain data (picklable when its model is importable), so it can travel to another process;
    it stays valid only while the row still carries ``token`` and is claimed.

    Attributes:
        model: The ``Claimable`` model class of the row.
        pk: The row's primary key.
        token: The row's ``claim_token`` written by this claim.
        worker: The worker name the claim was made for.
        lease_expires_at: When the lease ends, by the database clock (aware when ``USE_TZ = True``).
        attempt: The row's ``attempts`` after this claim (1 for a first claim).
        alias: The database alias the row lives on.
        lease: The lease length in seconds this claim was made (or last renewed) with; ``heartbeat()`` reuses
            it.
    """

    model: type[Claimable]
    pk: Any
    token: int
    worker: str
    lease_expires_at: datetime
    attempt: int
    alias: str
    lease: float

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, model: type[Claimable], alias: str, lease: float) -> Claim:
        """Build the claim a claiming statement returned.

        Args:
            row: The claimed row's columns by name: ``pk``, ``claim_token``, ``claimed_by``,
                ``lease_expires_at``, ``attempts``.
            model: The ``Claimable`` model of the row.
            alias: The database alias the row lives on.
            lease: The lease in seconds the claim was made with.

        Returns:
            The ``Claim``.
        """
        return cls(
            model=model,
            pk=row["pk"],
            token=int(row["claim_token"]),
            worker=str(row["claimed_by"]),
            lease_expires_at=row["lease_expires_at"],
            attempt=int(row["attempts"]),
            alias=alias,
            lease=lease,
        )


class Claimed(NamedTuple, Generic[M]):
    """A row ``claim_next(..., fetch=True)`` claimed: the model instance (as the claim left it) and its claim.

    Unpack it: ``for job, claim in claim_next(..., fetch=True):``.

    Attributes:
        instance: The claimed row as a model instance, loaded from the claiming statement itself.
        claim: Its ``Claim``.
    """

    instance: M
    claim: Claim


def instances(
    model: type[Claimable], alias: str, fields: Sequence[Field[Any, Any]], rows: Sequence[Row]
) -> list[Claimable]:
    """Build one instance per row, converting each value as a queryset would (``from_db_value``, backend).

    The converters are those Django's compiler applies to a column (``connection.ops.get_db_converters`` and
    the field's own), then ``Model.from_db`` builds the instance, so it is as if loaded by a ``QuerySet``
    (``_state.db`` is ``alias``, ``_state.adding`` is ``False``). See
    https://docs.djangoproject.com/en/stable/ref/models/instances/#customizing-model-loading.
    """
    connection = connections[alias]
    # USE_TZ too: MySQL's converters of date-times are chosen by it when they are listed (``override_settings``).
    key = (model, tuple(fields), settings.USE_TZ)
    per_connection = _CONVERTERS.get(connection)
    if per_connection is None:
        per_connection = _CONVERTERS.setdefault(connection, {})
    kept = per_connection.get(key)
    if kept is None:
        kept = per_connection[key] = _converters(connection, model, fields)
    converters, names = kept
    built: list[Claimable] = []
    for row in rows:
        values = []
        for name, column, functions in converters:
            value = row[name]
            for convert in functions:
                value = convert(value, column, connection)
            values.append(value)
        built.append(model.from_db(alias, names, values))
    return built


def stale_reason(claim: Claim, row: tuple[int, str, bool | None] | None) -> str | None:
    """Say what happened to ``claim``'s row, or return ``None`` when the row still carries the claim, live.

    Args:
        claim: The claim that was used.
        row: The row as it is now: ``(claim_token, claimed_by, live)``, where ``live`` is ``None`` when the row is
            not claimed (``lease_expires_at`` is NULL), ``False`` when its lease has expired by the database
            clock, ``True`` otherwise; ``None`` when the row is gone.

    Returns:
        A clause such as ``"it is now claimed by worker 'b' with token 7"``, or ``None``.
    """
    if row is None:
        return "the row no longer exists"
    token, worker, live = row
    ours = token == claim.token and worker == claim.worker
    if live is None:
        # complete(), release() and reclaim_expired() all end a claim by clearing its lease: they look alike.
        ended = "this claim" if ours else f"the later claim of worker {worker!r} with token {token}"
        return (
            f"it is no longer claimed by anyone: {ended} was completed or released (or handed back by "
            "reclaim_expired)"
        )
    if not ours:
        expired = ", whose lease has expired" if live is False else ""
        return f"it is now claimed by worker {worker!r} with token {token}{expired}"
    if live is False:
        return "its lease expired by the database clock"
    return None


__all__ = ["Claim", "Claimed"]


#: ``instances()``' converters and attribute names, per connection (its own ``ops``) and (model, fields, USE_TZ).
_CONVERTERS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[list[Any], list[str]]]]
_CONVERTERS = weakref.WeakKeyDictionary()


def _converters(
    connection: Any, model: type[Claimable], fields: Sequence[Field[Any, Any]]
) -> tuple[list[Any], list[str]]:
    """Each field's name in a claiming statement, column and converters (as a queryset's); the attribute names."""
    table = model._meta.db_table
    converters = []
    for index, field in enumerate(fields):
        column = field.get_col(table)
        functions = [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)]
        converters.append((fetched_column(index), column, functions))
    return converters, [field.attname for field in fields]
