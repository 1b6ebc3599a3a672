"""``enqueue()`` outside a transaction under real faults: a typed outcome, the row written once or not at all.

Committing at once, an enqueue's insert runs alone in autocommit, retried through lockkit's one retry path. A
``FaultProxy`` cuts its reply after the server committed (``deliver``) or never forwards it (``abort``, ``hold``);
a session ended right before the insert loses it before anything was written; a server that refuses connections
for longer than the default 5 s is waited out within ``LOCKKIT["RETRY"]["reconnect_within"]``. Each time the
task's row exists exactly once (or the error says it does not), and the next enqueue in the process works.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import OperationalError, connections
from django.tasks.signals import task_enqueued

from lockkit import CommitOutcomeUnknown, ConnectionLost, Failure, ReadOnlyDatabase, RetryEvent
from lockkit.tasks.models import QueuedTask
from lockkit_harness.cluster import TempCluster, missing_binaries
from lockkit_harness.proxy import FaultProxy
from lockkit_tests.support.faultkit import create_tables, ended_at_first_statement, extra_alias, proxied
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on

PROXIED = pytest.mark.django_db(transaction=True, databases=["default", "proxied"], available_apps=APPS)


def _through_proxy() -> list[Any]:
    """PostgreSQL and MariaDB, each reached through a ``FaultProxy`` under an alias of its own."""

    def mark(*databases: str) -> Any:
        return pytest.mark.django_db(transaction=True, databases=list(databases), available_apps=APPS)

    mariadb = (
        [mark("default", "mariadb", "proxied_mariadb")]
        if MYSQL_CONFIGURED
        else [pytest.mark.skip(reason=MYSQL_SKIP_REASON)]
    )
    return [
        pytest.param(("default", "proxied"), id="postgresql", marks=mark("default", "proxied")),
        pytest.param(("mariadb", "proxied_mariadb"), id="mariadb", marks=mariadb),
    ]


@pytest.fixture(params=_through_proxy())
def proxy_to(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, FaultProxy]]:
    """``(the database's alias, the alias through the proxy, the proxy)``."""
    like, name = request.param
    with proxied(like, name) as (alias, proxy):
        yield like, alias, proxy
        connections[alias].close()


#: How the task's insert starts on each vendor: on PostgreSQL with the ``NOTIFY`` around it, in one statement.
INSERT = {"postgresql": b"WITH inserted AS (INSERT", "mysql": b"INSERT"}


@pytest.fixture
def enqueued() -> Iterator[list[Any]]:
    """The results ``task_enqueued`` was sent for during the test."""
    sent: list[Any] = []

    def capture(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(task_result)

    task_enqueued.connect(capture, dispatch_uid="lockkit-enqueue-faults", weak=False)
    try:
        yield sent
    finally:
        task_enqueued.disconnect(dispatch_uid="lockkit-enqueue-faults")


def _ids(alias: str) -> list[str]:
    return [
        str(pk) for pk in QueuedTask.objects.using(alias).order_by("enqueued_at").values_list("pk", flat=True)
    ]


def test_a_cut_reply_after_the_insert_committed_returns_the_result_without_a_second_row(
    proxy_to: tuple[str, str, FaultProxy], enqueued: list[Any], settings: Any
) -> None:
    database, alias, proxy = proxy_to
    events: list[RetryEvent] = []
    settings.LOCKKIT = {"RETRY": {"before_retry": events.append}}
    with backend_on(alias):
        proxy.arm("deliver", statement=INSERT[connections[alias].vendor])
        result = jobs.calculate_meaning_of_life.enqueue()
        assert proxy.cuts["deliver"] == 1  # the reply really was cut, after the server committed
        assert events == []  # decided from the row: written, so not sent again
        assert _ids(database) == [result.id]
        assert [r.id for r in enqueued] == [result.id]  # task_enqueued once, for the row that exists
        after = jobs.calculate_meaning_of_life.enqueue()  # the next enqueue in the process works
        assert _ids(database) == [result.id, after.id]


@pytest.mark.parametrize("action", ["abort", "hold"])
def test_an_insert_that_never_reached_the_server_is_sent_again_once(
    proxy_to: tuple[str, str, FaultProxy], enqueued: list[Any], settings: Any, action: Any
) -> None:
    """``abort``: the session ends; ``hold``: it lives on, idle. Either way lockkit finds no row and sends again."""
    database, alias, proxy = proxy_to
    events: list[RetryEvent] = []
    settings.LOCKKIT = {"RETRY": {"before_retry": events.append}}
    with backend_on(alias):
        proxy.arm(action, statement=INSERT[connections[alias].vendor])
        try:
            result = jobs.calculate_meaning_of_life.enqueue()
        finally:
            proxy.release_held()
        assert proxy.cuts[action] == 1
        assert [(e.attempt, e.failure) for e in events] == [(1, Failure.CONNECTION_LOST)]
        assert _ids(database) == [result.id]  # sent again with the same id: one row
        assert [r.id for r in enqueued] == [result.id]
        assert jobs.calculate_meaning_of_life.enqueue().id in _ids(database)


def test_a_lost_reply_that_cannot_be_decided_is_commit_outcome_unknown(
    proxy_to: tuple[str, str, FaultProxy], enqueued: list[Any], settings: Any
) -> None:
    """The reply is cut after the server committed, and the proxy refuses every new connection meanwhile."""
    database, alias, proxy = proxy_to
    settings.LOCKKIT = {"RETRY": {"reconnect_within": 1}}
    with backend_on(alias):
        first = jobs.noop_task.enqueue()  # connected: the insert below goes on this connection
        proxy.arm("deliver", statement=INSERT[connections[alias].vendor])
        proxy.refuse_new = True
        try:
            with pytest.raises(CommitOutcomeUnknown) as info:
                jobs.calculate_meaning_of_life.enqueue()
        finally:
            proxy.refuse_new = False
        assert proxy.cuts["deliver"] == 1
        assert "check before doing it again" in str(info.value)
        assert [r.id for r in enqueued] == [first.id]  # none for the row whether written was not known
        (written,) = _ids(database)[1:]  # it had committed: the error did not claim otherwise
        assert jobs.calculate_meaning_of_life.enqueue().id in _ids(database)  # the next call works
        assert len(_ids(database)) == 3
        assert written in _ids(database)


def _vendors() -> list[Any]:
    def mark(*databases: str) -> Any:
        return pytest.mark.django_db(transaction=True, databases=list(databases), available_apps=APPS)

    mariadb = (
        [mark("default", "mariadb")] if MYSQL_CONFIGURED else [pytest.mark.skip(reason=MYSQL_SKIP_REASON)]
    )
    return [
        pytest.param("default", id="postgresql", marks=mark("default")),
        pytest.param("mariadb", id="mariadb", marks=mariadb),
    ]


@pytest.mark.parametrize("alias", _vendors())
def test_a_session_ended_before_the_insert_is_retried_and_writes_one_row(
    alias: str, enqueued: list[Any], settings: Any
) -> None:
    """The session the insert goes on is ended right before it (from another connection)."""
    events: list[RetryEvent] = []
    settings.LOCKKIT = {"RETRY": {"before_retry": events.append}}
    with backend_on(alias):
        jobs.noop_task.enqueue()  # connected, so that the session ended is the one the insert goes on
        with ended_at_first_statement(alias) as ended:
            result = jobs.calculate_meaning_of_life.enqueue()
        assert len(ended) == 1
        assert [(e.attempt, e.failure) for e in events] == [(1, Failure.CONNECTION_LOST)]
        assert _ids(alias)[1:] == [result.id]  # the session that ended wrote nothing: the retry wrote it once
        assert [r.id for r in enqueued][1:] == [result.id]
        assert jobs.noop_task.enqueue().id in _ids(alias)


MISSING = missing_binaries()
RESTARTABLE = "restartable"
OUTAGE = 7.0  # seconds the server refuses connections: longer than the default reconnect_within (5 s)


@pytest.fixture(scope="module")
def cluster() -> Iterator[TempCluster]:
    if MISSING is not None:
        pytest.skip(f"no throwaway cluster: {MISSING}")
    with TempCluster() as started:
        yield started


@pytest.mark.django_db(transaction=True, databases=["default", RESTARTABLE], available_apps=APPS)
def test_an_outage_longer_than_the_default_is_waited_out_within_the_settings_reconnect_within(
    cluster: TempCluster, settings: Any
) -> None:
    events: list[RetryEvent] = []
    settings.LOCKKIT = {"RETRY": {"reconnect_within": 30, "before_retry": events.append}}
    with extra_alias(
        RESTARTABLE, "default", HOST="127.0.0.1", PORT=cluster.port, NAME="postgres", OPTIONS={}
    ):
        with connections[RESTARTABLE].cursor() as cursor:
            cursor.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        create_tables(RESTARTABLE, QueuedTask)
        with backend_on(RESTARTABLE):
            first = jobs.calculate_meaning_of_life.enqueue()
            connections[RESTARTABLE].close()
            cluster.stop("fast")
            stopped = time.monotonic()
            timer = threading.Timer(OUTAGE, cluster.start)
            timer.daemon = True
            timer.start()
            try:
                result = jobs.calculate_meaning_of_life.enqueue()  # while the server refuses connections
                took = time.monotonic() - stopped
            finally:
                timer.join(60)
                assert not timer.is_alive()
                if not cluster.running():
                    cluster.start()
            assert (
                took >= OUTAGE
            )  # written only once the server was back, after longer than the default budget
            assert events
            assert {e.failure for e in events} == {Failure.CONNECTION_LOST}
            assert _ids(RESTARTABLE) == [first.id, result.id]
            # The default budget (5 s) gives up with ConnectionLost, typed, and nothing written.
            settings.LOCKKIT = {}
            connections[RESTARTABLE].close()
            cluster.stop("fast")
            try:
                with pytest.raises(ConnectionLost) as info:
                    jobs.calculate_meaning_of_life.enqueue()
            finally:
                cluster.start()
            assert not isinstance(info.value, CommitOutcomeUnknown)  # refused: nothing was sent
            assert isinstance(info.value.__cause__, OperationalError)
            assert len(_ids(RESTARTABLE)) == 2
            assert jobs.calculate_meaning_of_life.enqueue().id in _ids(RESTARTABLE)
        connections[RESTARTABLE].close()


@PROXIED
def test_a_read_only_server_is_read_only_database_and_nothing_is_written() -> None:
    """A session whose transactions are read-only, as on a standby (the ``proxied`` alias, here without a proxy)."""
    options = {"options": "-c default_transaction_read_only=on"}
    with extra_alias("proxied", "default", OPTIONS=options), backend_on("proxied"):
        with pytest.raises(ReadOnlyDatabase) as info:
            jobs.calculate_meaning_of_life.enqueue()
        assert info.value.sqlstate == "25006"
        assert _ids("default") == []
        connections["proxied"].close()
