"""A router that sends models marked ``lockkit_alias = "other"`` to the ``other`` database, both reads and writes."""

from __future__ import annotations

from typing import Any


class TestRouter:
    def _alias(self, model: type[Any]) -> str | None:
        return getattr(model, "lockkit_alias", None)

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return self._alias(model)

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return self._alias(model)

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        # Every table exists on both databases, so a query sent to the wrong alias would succeed silently
        # rather than fail loudly: the tests must catch it by watching which alias ran the queries.
        return True


class PrimaryReplicaRouter:
    """Reads from ``other`` (standing in for a read replica holding a copy of the rows), writes to ``default``."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return "other"

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return "default"

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return True

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        return True
