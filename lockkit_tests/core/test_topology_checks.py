"""``lockkit.W004``: a PostgreSQL alias that would not survive a failover or a dead peer (issue 23, item 3)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections

from lockkit.capabilities import topology_warnings
from lockkit.system_checks import check_capabilities, check_topology
from lockkit_tests.support.faultkit import extra_alias

ALIAS = "restartable"  # a mirror alias whose settings the test may change (nothing connects)
BOUNDED = {"tcp_user_timeout": 10_000, "keepalives_idle": 5}


def _warnings(**settings: Any) -> list[str]:
    with extra_alias(ALIAS, "default", **settings):
        return topology_warnings(ALIAS)


def test_a_multi_host_alias_without_target_session_attrs_is_warned() -> None:
    (found,) = _warnings(HOST="127.0.0.1,127.0.0.2", PORT="5432,5433", OPTIONS={})
    assert "target_session_attrs" in found
    assert "ReadOnlyDatabase" in found


@pytest.mark.parametrize("attrs", ["read-write", "primary", "READ-WRITE"])
def test_a_multi_host_alias_reaching_the_writable_node_only_is_fine(attrs: str) -> None:
    assert _warnings(HOST="127.0.0.1,127.0.0.2", OPTIONS={"target_session_attrs": attrs}) == []


@pytest.mark.parametrize("attrs", ["any", "prefer-standby", "read-only"])
def test_other_target_session_attrs_are_warned(attrs: str) -> None:
    (found,) = _warnings(HOST="127.0.0.1,127.0.0.2", OPTIONS={"target_session_attrs": attrs})
    assert "target_session_attrs" in found


def test_a_remote_host_without_a_dead_peer_bound_is_warned_and_named() -> None:
    (found,) = _warnings(HOST="db.example.internal", OPTIONS={})
    assert "db.example.internal" in found
    assert "tcp_user_timeout" in found


@pytest.mark.parametrize("options", [{"tcp_user_timeout": 10_000}, {"keepalives_idle": 5}, BOUNDED])
def test_a_remote_host_with_a_bound_is_fine(options: dict[str, int]) -> None:
    assert _warnings(HOST="db.example.internal", OPTIONS=options) == []


@pytest.mark.parametrize("host", ["", "localhost", "127.0.0.1", "::1", "/var/run/postgresql", "127.0.0.53"])
def test_local_hosts_need_no_dead_peer_bound(host: str) -> None:
    assert _warnings(HOST=host, OPTIONS={}) == []


def test_both_problems_of_one_alias_are_reported_as_w004() -> None:
    with extra_alias(ALIAS, "default", HOST="pg1.internal,pg2.internal", OPTIONS={}):
        found = [m for m in check_topology() if m.obj == ALIAS]
    assert [m.id for m in found] == ["lockkit.W004", "lockkit.W004"]
    assert all("/ha/" in (m.hint or "") for m in found)


def test_the_test_settings_themselves_raise_no_w004() -> None:
    assert [m for m in check_topology() if m.obj != ALIAS] == []
    assert connections["default"].vendor == "postgresql"


@pytest.mark.django_db(transaction=True, databases=["default", ALIAS])
@pytest.mark.parametrize(
    ("server_ms", "lockkit_settings", "warned"),
    [
        (2000, {}, True),  # 2 s < the default lock_timeout of 5 s
        (10_000, {}, False),
        (2000, {"LOCK_TIMEOUT": 1}, False),
        (2000, {"STATEMENT_TIMEOUT": 30}, False),  # scopes set their own statement timeout
        (0, {}, False),
    ],
)
def test_a_server_statement_timeout_shorter_than_lock_timeout_is_w005(
    settings: Any, server_ms: int, lockkit_settings: dict[str, Any], warned: bool
) -> None:
    settings.LOCKKIT = lockkit_settings
    options = {"options": f"-c statement_timeout={server_ms}"}
    with extra_alias(ALIAS, "default", OPTIONS=options):
        found = [m for m in check_capabilities(databases=[ALIAS]) if m.id == "lockkit.W005"]
        connections[ALIAS].close()
    assert len(found) == int(warned)
    if warned:
        assert "2 s" in found[0].msg
        assert "5 s" in found[0].msg
