"""``enqueue()`` outside a transaction under real faults: a typed outcome, the row written once or not at all.

Committing at once, an enqueue's insert runs alone in autocommit, retried through lockkit's one retry path. A
``FaultProxy`` cuts its reply after the server committed (``deliver``) or never forwards it (``abort``, ``hold``);
a session ended right before the insert loses it before anything was written; a server that refuses connections
for longer than the default 5 s is waited out within ``LOCKKIT["RETRY"]["reconnect_within"]``. Each time the
task's row exists exactly once (or the error says it does not), and the next enqueue in the process works.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import IntegrityError, OperationalError, connections
from django.tasks.signals import task_enqueued

from lockkit import CommitOutcomeUnknown, ConnectionLost, Failure, ReadOnlyDatabase, RetryEvent
from lockkit.backends import backend_for
from lockkit.tasks.models import QueuedTask
from lockkit_harness.cluster import TempCluster, missing_binaries
from lockkit_harness.proxy import FaultProxy
from lockkit_tests.support.faultkit import (
    behind_pgbouncer,
    create_tables,
    ended_at_first_statement,
    extra_alias,
    proxied,
)
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


BOUNCED = pytest.mark.django_db(
    transaction=True, databases=["default", "bouncer", "proxied"], available_apps=APPS
)


@pytest.fixture
def through_pgbouncer() -> Iterator[tuple[str, FaultProxy]]:
    """A ``FaultProxy`` in front of a PgBouncer (transaction mode) in front of the default database."""
    with behind_pgbouncer("default", {}) as bouncer, proxied(bouncer, "proxied") as (alias, proxy):
        yield alias, proxy
        connections[alias].close()
        connections[bouncer].close()


@BOUNCED
def test_behind_a_pooler_a_row_not_found_is_unknown_at_once_not_sent_again(
    through_pgbouncer: tuple[str, FaultProxy], enqueued: list[Any], settings: Any
) -> None:
    """The driver's session id is PgBouncer's, not a server session's: lockkit cannot wait that session out.

    Found by a hostile review: the insert was taken for lost and sent again while the first still ran, which
    raised ``IntegrityError`` for a row that was written.
    """
    alias, proxy = through_pgbouncer
    events: list[RetryEvent] = []
    settings.LOCKKIT = {"RETRY": {"before_retry": events.append, "reconnect_within": 30}}
    with backend_on(alias):
        first = jobs.noop_task.enqueue()
        proxy.arm("abort", statement=INSERT["postgresql"])
        started = time.monotonic()
        with pytest.raises(CommitOutcomeUnknown) as info:
            jobs.calculate_meaning_of_life.enqueue()
        assert time.monotonic() - started < 15  # said at once, not after reconnect_within (30 s)
        assert "the INSERT of a task" in str(info.value)
        assert events == []  # not sent again
        assert _ids("default") == [first.id]  # (here it never arrived: the error did not claim otherwise)
        assert [r.id for r in enqueued] == [first.id]
        proxy.arm("deliver", statement=INSERT["postgresql"])
        written = jobs.calculate_meaning_of_life.enqueue()  # written, its reply cut: found, so done
        assert proxy.cuts["deliver"] == 1
        assert _ids("default") == [first.id, written.id]
        assert [r.id for r in enqueued] == [first.id, written.id]


FIXED_ID = "3a0f3f0e-8f5d-4d43-9a55-0a4c3c7d1e01"


def test_a_repeated_id_whose_reply_was_cut_is_refused_not_reported_as_written(
    proxy_to: tuple[str, str, FaultProxy], enqueued: list[Any], settings: Any
) -> None:
    """A custom ``id_function`` that repeats an id: the row with that id is another enqueue's, not this one's."""
    database, alias, proxy = proxy_to
    with backend_on(alias, id_function=lambda: FIXED_ID):
        first = jobs.noop_task.enqueue("FIRST")
        proxy.arm("deliver", statement=INSERT[connections[alias].vendor])  # the server refuses it; reply cut
        with pytest.raises(IntegrityError):
            jobs.noop_task.enqueue("SECOND")
        assert proxy.cuts["deliver"] == 1
        (row,) = QueuedTask.objects.using(database).all()
        assert (str(row.pk), row.args_kwargs["args"]) == (first.id, ["FIRST"])
        assert [r.id for r in enqueued] == [first.id]  # no task_enqueued for a task that was not enqueued


class Interrupted(BaseException):
    """Raised by the test's signal handler, as a time limit's handler would."""


SLOW_INSERT = {
    "postgresql": (
        [
            "CREATE FUNCTION lockkit_test_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.args_kwargs->'kwargs' ? 'slow' THEN PERFORM pg_sleep(2); END IF; RETURN NEW; END $$",
            "CREATE TRIGGER lockkit_test_slow BEFORE INSERT ON lockkit_tasks_queuedtask FOR EACH ROW "
            "EXECUTE FUNCTION lockkit_test_slow()",
        ],
        ["DROP TRIGGER lockkit_test_slow ON lockkit_tasks_queuedtask", "DROP FUNCTION lockkit_test_slow()"],
        "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'PgSleep'",
    ),
    "mysql": (
        [
            "CREATE TRIGGER lockkit_test_slow BEFORE INSERT ON lockkit_tasks_queuedtask FOR EACH ROW BEGIN "
            "IF JSON_EXTRACT(NEW.args_kwargs, '$.kwargs.slow') IS NOT NULL THEN SET @slept = SLEEP(2); END IF; "
            "END"
        ],
        ["DROP TRIGGER lockkit_test_slow"],
        "SELECT 1 FROM information_schema.processlist WHERE id = %s AND state = 'User sleep'",
    ),
}


@pytest.mark.parametrize("alias", _vendors())
def test_an_exception_raised_mid_insert_says_whether_the_task_was_enqueued(
    alias: str, enqueued: list[Any]
) -> None:
    """A signal handler's exception while the insert runs (seen running from another connection)."""
    create, drop, running = SLOW_INSERT[connections[alias].vendor]
    with connections[alias].cursor() as cursor:
        for statement in create:
            cursor.execute(statement)
    previous = signal.signal(signal.SIGUSR1, _raise_interrupted)
    try:
        with backend_on(alias):
            jobs.noop_task.enqueue()  # connected: the session to watch
            session = backend_for(connections[alias]).sessions.local_session_id(connections[alias])
            main = threading.get_ident()
            watcher = threading.Thread(target=_signal_when, args=(alias, running, session, main))
            watcher.start()
            try:
                with pytest.raises(Interrupted) as info:
                    jobs.noop_task.enqueue(slow=True)
            finally:
                watcher.join(30)
            assert not watcher.is_alive()
            (note,) = info.value.__notes__
            written = QueuedTask.objects.using(alias).filter(args_kwargs__kwargs__slow=True).exists()
            assert note.endswith(
                "was enqueued on " + repr(alias) + " before this was raised"
                if written
                else "was not enqueued"
            ), note
            assert len(enqueued) == 1  # the call did not return: no task_enqueued
            after = jobs.noop_task.enqueue()  # the next enqueue in the process works
            assert after.id in _ids(alias)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        with connections[alias].cursor() as cursor:
            for statement in drop:
                cursor.execute(statement)


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted("time limit")


def _signal_when(alias: str, running: str, session: int, main: int) -> None:
    """Send SIGUSR1 to the main thread once ``session`` is seen sleeping in the insert's trigger."""
    watcher = connections.create_connection(alias)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with watcher.cursor() as cursor:
                cursor.execute(running, [session])
                if cursor.fetchone():
                    signal.pthread_kill(main, signal.SIGUSR1)
                    return
            time.sleep(0.01)
    finally:
        watcher.close()
