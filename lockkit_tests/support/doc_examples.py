"""The namespace the documentation's code examples run in: README.md and docs/*.md, collected by Sybil.

The examples import a user's project as a user would write it (``from shop.models import Stock``). While a
document's examples run, the modules below exist in ``sys.modules`` and map those names onto real models of the
test suite and the sample project, so every example runs for real against the test database (aliases ``default``
and ``other``). A block that cannot run here is marked in the Markdown with ``<!-- skip: next "reason" -->``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

# The documents whose examples run, relative to the repository root, and the aliases they may use.
DOCUMENTS = ("README.md", "docs/*.md", "docs/*/*.md")
DATABASES = ("default", "other")
_FAKE_MODULES = (
    "shop",
    "shop.models",
    "shop.services",
    "shop.warehouse",
    "myapp",
    "myapp.models",
    "myapp.jobs",
)


class RetryableError(Exception):
    """What the docs' job code raises for a failure worth another attempt."""


def _modules() -> dict[str, dict[str, Any]]:
    # Imported here, not at module level: conftest.py imports this module before Django is set up.
    from lockkit_tests.models import DocAccount, RemoteItem
    from sample_project.inventory.models import Stock
    from sample_project.jobs.models import Job

    warehouse_calls: list[tuple[str, int]] = []

    def notify_warehouse(sku: str, quantity: int) -> None:
        warehouse_calls.append((sku, quantity))

    def run(job: Any, keep_alive: Any = None) -> dict[str, Any]:
        if keep_alive is not None:
            keep_alive()
        return {"ok": True, "job": job.pk}

    return {
        "shop": {},
        # Stock: sku (primary key), available. Account: owner, balance. LedgerEntry: name, value, routed to "other".
        "shop.models": {"Stock": Stock, "Account": DocAccount, "LedgerEntry": RemoteItem},
        "shop.warehouse": {"notify_warehouse": notify_warehouse, "calls": warehouse_calls},
        "myapp": {},
        "myapp.models": {"Job": Job},
        "myapp.jobs": {"run": run, "RetryableError": RetryableError},
    }


def setup(namespace: dict[str, Any]) -> None:
    """Install the user-project modules for one document (Sybil calls this before its first example)."""
    for name, attributes in _modules().items():
        module = types.ModuleType(name, f"lockkit docs fixture standing in for a user's {name!r}")
        module.__dict__.update(attributes)
        sys.modules[name] = module
    # shop.services is the document's own service code: a name imported from it is the one an earlier example of
    # the same document defined (getting-started.md's reserve_stock, imported by its test).
    services = types.ModuleType("shop.services", "lockkit docs fixture: the services the document defines")
    services.__getattr__ = lambda attribute: _defined(namespace, attribute)  # type: ignore[method-assign]
    sys.modules["shop.services"] = services
    namespace["__name__"] = "docs_example"


def _defined(namespace: dict[str, Any], attribute: str) -> Any:
    try:
        return namespace[attribute]
    except KeyError:
        raise AttributeError(f"no earlier example of this document defines {attribute!r}") from None


def flush() -> None:
    """Empty every table of the examples' databases (Django's ``flush``, as ``TransactionTestCase`` does)."""
    from django.core.management import call_command

    for alias in DATABASES:
        call_command("flush", database=alias, interactive=False, verbosity=0, inhibit_post_migrate=True)


def teardown(namespace: dict[str, Any]) -> None:
    """Remove them again after the document's last example."""
    for name in _FAKE_MODULES:
        sys.modules.pop(name, None)
