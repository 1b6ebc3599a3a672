"""The per-vendor interface, with the generic behaviour: capabilities from Django's feature flags, no timeouts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import NotSupportedError

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

# What a backend hands back from begin_scope to restore on exit; opaque to the caller.
TimeoutToken = Any


class Backend:
    """Generic behaviour for a vendor lockkit has no special support for.

    A backend says which ``select_for_update`` options the database honours and applies a scope's timeouts.
    """

    def select_for_update_kwargs(
        self, connection: BaseDatabaseWrapper, *, nowait: bool, skip_locked: bool, no_key: bool
    ) -> dict[str, Any]:
        """Return the ``select_for_update()`` keyword arguments for a scope's options.

        Raises:
            NotSupportedError: the database cannot honour an option the scope asked for.
        """
        features = connection.features
        kwargs: dict[str, Any] = {}
        if nowait:
            if not features.has_select_for_update_nowait:
                raise NotSupportedError(
                    f"nowait=True is not supported on {connection.vendor} ({connection.alias!r})"
                )
            kwargs["nowait"] = True
        if skip_locked:
            if not features.has_select_for_update_skip_locked:
                raise NotSupportedError(
                    f"skip_locked=True is not supported on {connection.vendor} ({connection.alias!r})"
                )
            kwargs["skip_locked"] = True
        if no_key:
            if not features.has_select_for_no_key_update:
                raise NotSupportedError(
                    f"no_key=True is not supported on {connection.vendor} ({connection.alias!r})"
                )
            kwargs["no_key"] = True
        if features.has_select_for_update_of:
            # Lock only the queried model's rows: select_related() on a nullable foreign key would otherwise
            # fail (FOR UPDATE cannot apply to the nullable side of an outer join) or lock related rows.
            kwargs["of"] = ("self",)
        return kwargs

    def begin_scope(
        self,
        connection: BaseDatabaseWrapper,
        *,
        lock_timeout: float | None,
        statement_timeout: float | None,
        nested: bool,
    ) -> TimeoutToken:
        """Apply a scope's timeouts right after its transaction or savepoint began; return what to restore."""
        return None

    def end_scope(self, connection: BaseDatabaseWrapper, token: TimeoutToken) -> None:
        """Restore the enclosing timeouts when a nested scope ends without error."""
