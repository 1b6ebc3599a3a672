"""The stack of active scope blocks of this thread or task, and the public ``current_scope()``/``lock()`` on it.

A ``contextvars.ContextVar`` (per thread and per task) holds the open ``ScopeBlock``s, outermost first.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import models
from django.db.models import QuerySet

from lockkit.errors import NotInLockedScope

if TYPE_CHECKING:
    from typing_extensions import TypeVar as _TypeVarWithDefault

    from lockkit.scopes.blocks import ScopeBlock
    from lockkit.scopes.scope import LockScope

    M = _TypeVarWithDefault("M", bound=models.Model, default=Any)
else:
    M = TypeVar("M", bound=models.Model)

scopes: ContextVar[tuple[ScopeBlock, ...]] = ContextVar("lockkit_scopes", default=())


def innermost_scope() -> LockScope | None:
    """The innermost active ``LockScope`` of this thread or task, or ``None``."""
    stack = scopes.get()
    return stack[-1].scope if stack else None


def active_blocks() -> tuple[ScopeBlock, ...]:
    """The open scope blocks of this thread or task, outermost first."""
    return scopes.get()


def current_scope() -> LockScope:
    """Return the innermost active ``LockScope`` of this thread or task.

    Raises:
        NotInLockedScope: no ``locked()`` scope or ``locked_operation`` is active here.
    """
    scope = innermost_scope()
    if scope is None:
        raise NotInLockedScope(
            "no locked() scope is active; open one with lockkit.locked() or @locked_operation"
        )
    return scope


def lock(target: QuerySet[M] | type[M] | M) -> QuerySet[M]:
    """Lock a queryset's rows in the innermost active scope: ``current_scope().lock(target)``.

    Raises:
        NotInLockedScope: no scope is active.
        AliasMismatch: the queryset or instance is bound to another alias than the scope's, or a router sends
            the model to another alias.
        TypeError: ``target`` is not a queryset, a model class or a model instance.
        ValueError: ``target`` is an unsaved instance.
    """
    return current_scope().lock(target)
