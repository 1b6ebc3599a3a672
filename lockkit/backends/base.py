"""The per-vendor interface, with the generic behaviour: capabilities from Django's feature flags, no timeouts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import NotSupportedError

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.transaction import Atomic

# What a backend hands back from begin_scope to restore on exit; opaque to the caller.
TimeoutToken = Any


class Backend:
    """Generic behaviour for a vendor lockkit has no special support for.

    A backend says which ``select_for_update`` options the database honours and applies a scope's timeouts.
    """

    def timeout_support(self, connection: BaseDatabaseWrapper) -> tuple[str | None, str | None]:
        """Say how a scope's ``lock_timeout`` and ``statement_timeout`` are applied here (``None``: they are not)."""
        return None, None

    def server_warnings(self, connection: BaseDatabaseWrapper) -> list[str]:
        """Return what the server itself says that limits lockkit here (a read-only standby); may connect."""
        return []

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

    def begin_transaction(
        self,
        connection: BaseDatabaseWrapper,
        atomic: Atomic,
        *,
        lock_timeout: float | None,
        statement_timeout: float | None,
        nested: bool,
    ) -> None:
        """Begin the scope's transaction or savepoint: ``atomic.__enter__()``.

        A backend overrides this when the transaction must begin differently (SQLite begins it with
        ``BEGIN IMMEDIATE`` so the write lock is taken, and waited for, when the scope begins). If it raises, no
        transaction or savepoint is left open.
        """
        atomic.__enter__()

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
        """Restore the enclosing timeouts when a nested scope ends without error, before its savepoint is released.

        For settings that live in the transaction (PostgreSQL's ``set_config(..., true)``): on error the savepoint
        rollback restores them by itself, and the end of the outermost transaction discards them.
        """

    def after_scope(self, connection: BaseDatabaseWrapper, token: TimeoutToken, *, nested: bool) -> None:
        """Restore session settings after the scope's transaction or savepoint ended, with or without error.

        Called only when ``begin_scope`` returned a token that is not ``None``, after the commit, the savepoint
        release or the rollback, for nested and outermost scopes alike. For settings a rollback does not revert
        (MySQL's session variables, SQLite's busy timeout), so that no value reaches the next user of the
        connection. An implementation that cannot restore must not leave the altered value behind (close the
        connection when it is outside any transaction).
        """
