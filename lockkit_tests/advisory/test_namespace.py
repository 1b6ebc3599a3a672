"""Co-tenants and ``settings.LOCKKIT["ADVISORY_NAMESPACE"]`` (issue 33, item 5).

Another account on the same server can take an application's advisory keys (a ``str`` key's hash is public, and a
MariaDB ``GET_LOCK`` name needs no privilege at all) and block its jobs. With a per-project namespace the hashed
keys are the project's own: the co-tenant's lock on the un-namespaced key no longer blocks them, and two sessions of
the project still exclude each other. Real accounts on the real servers.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.checks import Error
from django.db import connections
from django.test.utils import CaptureQueriesContext, override_settings

import lockkit
from lockkit.advisory.keys import advisory_key, hash_text
from lockkit.conf import SettingTypeError, SettingValueError
from lockkit.system_checks import check_settings
from lockkit.testing import in_thread
from lockkit_tests.support.vendors import vendor_params

JOIN = 30.0
NAMESPACE = "shop-7f3a9c"


@pytest.fixture
def co_tenant(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A raw connection of another, unprivileged account of the alias's server, to the same database."""
    alias: str = request.node.callspec.params["alias"]
    settings = connections[alias].settings_dict
    name = f"h_tenant_{uuid.uuid4().hex[:8]}"
    admin = connections[alias]
    if admin.vendor == "postgresql":
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE ROLE {name} LOGIN")  # no grants: it can still take any advisory key
        raw: Any = psycopg.connect(
            host=settings["HOST"], port=settings["PORT"], user=name, dbname=settings["NAME"], autocommit=True
        )
    else:
        import MySQLdb  # the mysql extra: only where a MariaDB/MySQL alias is configured

        with admin.cursor() as cursor:
            cursor.execute(f"CREATE USER '{name}'@'%%'")  # no privilege on any database
        raw = MySQLdb.connect(host=settings["HOST"], port=int(settings["PORT"] or 3306), user=name)
    try:
        yield raw
    finally:
        raw.close()
        with admin.cursor() as cursor:
            cursor.execute(
                f"DROP ROLE {name}" if admin.vendor == "postgresql" else f"DROP USER '{name}'@'%%'"
            )


def take_as_co_tenant(raw: Any, alias: str, key: str) -> None:
    """The co-tenant takes the key's documented un-namespaced lock (the public hash, or the GET_LOCK name)."""
    checked = advisory_key(key)
    cursor = raw.cursor()
    if connections[alias].vendor == "postgresql":
        cursor.execute("SELECT pg_advisory_lock(%s)", [checked.value])
    else:
        cursor.execute(
            "SELECT GET_LOCK(%s, 0)", [checked.lock_name(str(connections[alias].settings_dict["NAME"]))]
        )
        assert cursor.fetchone()[0] == 1
    cursor.close()


def enter(alias: str, key: str) -> str:
    try:
        with lockkit.advisory_lock(key, using=alias, nowait=True):
            return "entered"
    except lockkit.LockNotAvailable:
        return "refused"


@pytest.mark.parametrize("alias", vendor_params())
def test_a_co_tenant_blocks_the_default_keys_but_not_a_namespaced_project(alias: str, co_tenant: Any) -> None:
    take_as_co_tenant(co_tenant, alias, "nightly")
    assert enter(alias, "nightly") == "refused"  # the risk, with the default (django-pglock's keys)
    with override_settings(LOCKKIT={"ADVISORY_NAMESPACE": NAMESPACE}):
        with lockkit.advisory_lock("nightly", using=alias, nowait=True) as held:
            assert held.key.value == hash_text("nightly", namespace=NAMESPACE) != hash_text("nightly")
            # Two sessions of the project still exclude each other.
            assert in_thread(enter, alias, "nightly").result(JOIN) == "refused"
        assert in_thread(enter, alias, "nightly").result(JOIN) == "entered"


def test_the_namespaced_hash_is_documented_and_int_keys_are_not_namespaced() -> None:
    expected = int.from_bytes(hashlib.sha256(b"shop-7f3a9c\x00nightly").digest()[:8], "little", signed=True)
    assert hash_text("nightly", namespace=NAMESPACE) == expected
    assert advisory_key(("billing", 42), namespace=NAMESPACE).value == hash_text(
        '["billing",42]', namespace=NAMESPACE
    )
    assert advisory_key(42, namespace=NAMESPACE).value == 42
    assert advisory_key((1, 2), namespace=NAMESPACE).pair == (1, 2)
    assert (
        advisory_key("nightly").value == hash_text("nightly") == 1630262648214010666
    )  # the default: unchanged


@pytest.mark.django_db(transaction=True, databases=["default"])
@pytest.mark.parametrize(
    ("value", "error"),
    [
        (42, SettingTypeError),
        (b"shop", SettingTypeError),
        ("", SettingValueError),
        ("a\x00b", SettingValueError),
    ],
)
def test_a_bad_namespace_is_refused_naming_the_setting_before_any_sql(
    value: object, error: type[Exception]
) -> None:
    with override_settings(LOCKKIT={"ADVISORY_NAMESPACE": value}):
        with (
            CaptureQueriesContext(connections["default"]) as queries,
            pytest.raises(error, match="ADVISORY_NAMESPACE"),
        ):
            with lockkit.advisory_lock("nightly", nowait=True):
                pytest.fail("entered with a bad namespace")
        assert len(queries) == 0
        with pytest.raises(error, match="ADVISORY_NAMESPACE"), lockkit.locked() as scope:
            scope.advisory_lock("nightly")
        (found,) = check_settings(None)
        assert isinstance(found, Error)
        assert found.id == "lockkit.E003"
        assert "ADVISORY_NAMESPACE" in found.msg


@pytest.mark.parametrize("namespace", ["a\x00b", "", "\ud800", 42])
def test_hash_text_and_advisory_key_refuse_a_namespace_the_setting_would_refuse(namespace: Any) -> None:
    """``hash_text``/``advisory_key`` are public: a NUL in ``namespace`` would make two namespaces share keys.

    ``hash_text("b\\x00c", namespace="a")`` and ``hash_text("c", namespace="a\\x00b")`` hash the same bytes.
    """
    with pytest.raises((TypeError, ValueError), match="namespace"):
        hash_text("c", namespace=namespace)
    with pytest.raises((TypeError, ValueError), match="namespace"):
        advisory_key("c", namespace=namespace)
    assert hash_text("c", namespace="a") != hash_text("c")  # the next call works
