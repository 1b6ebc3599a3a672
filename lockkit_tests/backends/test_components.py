"""The vendor interface is composed of small parts (``features``, ``tx``, ``locks``, ``sessions``), the same per vendor.

Pure introspection of the backend classes: no database is reached.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from django.db import connections

from lockkit.backends import Backend, backend_for, vendors
from lockkit.backends.base import COMPONENTS, Features, Locks, Sessions, Transactions
from lockkit.backends.mysql import MySQLBackend
from lockkit.backends.postgresql import PostgreSQLBackend
from lockkit.backends.sqlite import SQLiteBackend

#: Django's backend parts stay small: above this a part is doing two jobs, and should be split.
MAX_HOOKS = 16

BACKENDS: list[Backend] = [Backend(), *vendors()]
IDS = [type(backend).__name__ for backend in BACKENDS]


def hooks(part: Any) -> dict[str, Any]:
    """The public hooks of a part: its methods and its flags, by name (object's own attributes left out)."""
    return {name: value for name, value in inspect.getmembers(type(part)) if not name.startswith("_")}


def parameters(function: Any) -> list[tuple[str, Any, Any]]:
    """A function's parameters as (name, kind, default): how a caller calls it."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_parts_are_the_four_django_style_components() -> None:
    assert dict(COMPONENTS) == {
        "features": Features,
        "tx": Transactions,
        "locks": Locks,
        "sessions": Sessions,
    }
    assert sorted(type(backend).__name__ for backend in vendors()) == [
        "MySQLBackend",
        "PostgreSQLBackend",
        "SQLiteBackend",
    ]


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
@pytest.mark.parametrize("name", list(COMPONENTS))
def test_no_part_has_more_than_sixteen_hooks(backend: Backend, name: str) -> None:
    part = getattr(backend, name)
    found = hooks(part)
    assert found, f"{type(part).__name__} has no hooks"
    assert len(found) <= MAX_HOOKS, f"{type(part).__name__} has {len(found)} hooks: {sorted(found)}"


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_a_backend_is_only_its_parts(backend: Backend) -> None:
    # Every hook lives in a part: the backend itself holds the four parts and the classes they are built from.
    assert {name for name in vars(backend) if not name.startswith("_")} == set(COMPONENTS)
    assert {name for name, _ in inspect.getmembers(type(backend)) if not name.startswith("_")} == {
        "features_class",
        "transactions_class",
        "locks_class",
        "sessions_class",
    }


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
@pytest.mark.parametrize(("name", "generic"), list(COMPONENTS.items()))
def test_every_vendor_implements_the_same_interface(backend: Backend, name: str, generic: type) -> None:
    part = getattr(backend, name)
    assert isinstance(part, generic)
    expected, found = hooks(generic()), hooks(part)
    # No vendor adds a public hook a caller could not rely on for every vendor.
    assert sorted(found) == sorted(expected)
    for hook, value in found.items():
        base = expected[hook]
        if callable(base):
            # The same parameters, called the same way (a vendor may narrow a return annotation).
            assert parameters(value) == parameters(base), f"{type(part).__name__}.{hook}"
        else:
            assert type(value) is type(base), f"{type(part).__name__}.{hook}"


def test_hooks_are_not_split_across_parts() -> None:
    # One name, one part: a caller never has to guess whether it is backend.tx.x or backend.sessions.x.
    owners: dict[str, list[str]] = {}
    for name, generic in COMPONENTS.items():
        for hook in hooks(generic()):
            owners.setdefault(hook, []).append(name)
    assert {hook: parts for hook, parts in owners.items() if len(parts) > 1} == {}


def test_vendors_override_what_differs() -> None:
    # Spot checks that each vendor's parts are its own (a part left generic by mistake would pass the tests above).
    postgresql, mysql, sqlite = PostgreSQLBackend(), MySQLBackend(), SQLiteBackend()
    assert postgresql.features.claims_name == "PostgreSQL"
    assert postgresql.features.watches_failed_statements is False
    assert postgresql.features.lock_waits_bound_end_with_transaction is True
    assert mysql.features.advisory_locks_end_with_transaction is False
    assert mysql.features.watches_failed_statements is True
    assert sqlite.features.claims_name == "SQLite 3.35+"
    assert type(postgresql.tx).apply_timeouts is not Transactions.apply_timeouts
    assert type(mysql.tx).after_transaction_end is not Transactions.after_transaction_end
    assert type(sqlite.tx).open_transaction is not Transactions.open_transaction
    assert type(sqlite.sessions).lock_waits is Sessions.lock_waits  # SQLite has no sessions to inspect


def test_backend_for_picks_the_vendor_of_a_connection() -> None:
    assert type(backend_for(connections["default"])) is PostgreSQLBackend
    assert type(backend_for(connections["sqlite"])) is SQLiteBackend
    # One backend object per vendor: its parts are built once and shared by every connection.
    assert backend_for(connections["default"]).tx is backend_for(connections["default"]).tx
