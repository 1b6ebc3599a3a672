"""A worker whose database alias names a database or user the server does not have: it stops at start, exit 1, with
one line naming the alias, the database and the server's message, instead of waiting for ever (issue 34); an
``enqueue()`` there raises ``DatabaseMisconfigured`` at once.

A server that is down at start is still waited out: ``test_start_outage.py``.
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from lockkit import DatabaseMisconfigured, RetryEvent
from lockkit_tests.support.faultkit import extra_alias
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, worker_process

# Aliases declared as mirrors in the test settings, pointed here at settings the server refuses.
VENDORS = [
    pytest.param(
        ("restartable", "default"),
        id="postgresql",
        marks=pytest.mark.django_db(
            transaction=True, databases=["default", "restartable"], available_apps=APPS
        ),
    ),
    pytest.param(
        ("proxied_mariadb", "mariadb"),
        id="mariadb",
        marks=[
            pytest.mark.django_db(
                transaction=True, databases=["default", "mariadb", "proxied_mariadb"], available_apps=APPS
            )
        ]
        if MYSQL_CONFIGURED
        else [pytest.mark.skip(reason=MYSQL_SKIP_REASON)],
    ),
]
WRONG = {
    "name": ({"NAME": "ha_no_such_database"}, ("ha_no_such_database",)),
    # PostgreSQL: role "..." does not exist; MariaDB: Access denied for user '...'.
    "user": ({"USER": "ha_no_such_user"}, ("ha_no_such_user",)),
}


@pytest.mark.parametrize("wrong", sorted(WRONG))
@pytest.mark.parametrize("aliases", VENDORS)
@pytest.mark.parametrize("args", [(), ("--burst",)], ids=["worker", "drain"])
def test_a_worker_whose_settings_the_server_refuses_exits_at_once_naming_them(
    aliases: tuple[str, str], wrong: str, args: tuple[str, ...]
) -> None:
    mirror, like = aliases
    overrides, named = WRONG[wrong]
    with extra_alias(mirror, like, **overrides) as alias, worker_process(alias, *args) as worker:
        code, log = worker.wait(timeout=30)  # a worker that waits for the server would fail here, not hang
    assert code == 1, log
    assert "Traceback" not in log
    assert "cannot be reached" not in log  # not waited for
    lines = [line for line in log.splitlines() if "lockkit_worker cannot start" in line]
    assert len(lines) == 1, log
    line = lines[0]
    assert f"database alias {alias!r}" in line
    for name in named:
        assert name in line  # the setting that is wrong, and the server's own words about it
    assert ("does not exist" in line) or ("Unknown database" in line) or ("Access denied" in line)


@pytest.mark.parametrize("wrong", sorted(WRONG))
@pytest.mark.parametrize("aliases", VENDORS)
def test_an_enqueue_the_server_refuses_the_settings_of_raises_at_once(
    aliases: tuple[str, str], wrong: str
) -> None:
    mirror, like = aliases
    retries: list[RetryEvent] = []
    policy = {"reconnect_within": 30, "before_retry": retries.append}
    with override_settings(LOCKKIT={"RETRY": policy}), extra_alias(mirror, like, **WRONG[wrong][0]) as alias:
        with backend_on(alias), pytest.raises(DatabaseMisconfigured) as caught:
            jobs.calculate_meaning_of_life.enqueue()
    assert retries == []
    assert caught.value.attempts == 1
    assert caught.value.alias == alias
