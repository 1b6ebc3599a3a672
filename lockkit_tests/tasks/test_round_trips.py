"""What one trivial task costs the worker's connection: messages on PostgreSQL, statements on MariaDB (issue 34).

Counted on the worker's own connection (the main thread's: ``--concurrency 1`` runs tasks there) with Django's
``CaptureQueriesContext``, which records each ``execute()`` without an execute wrapper (a wrapper would send the
claims through a scope instead of one message). A PostgreSQL message of several statements is one ``execute()``.
"""

from __future__ import annotations

import time

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from lockkit.claims import claim_next, complete
from lockkit.errors import LockTimeout
from lockkit.testing import hold_lock
from lockkit_tests.models import Job
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, rows, run_worker

TASKS = 20


def _tx(*databases: str) -> pytest.MarkDecorator:
    return pytest.mark.django_db(
        transaction=True,
        databases=list(databases),
        available_apps=["lockkit", "lockkit.tasks", "lockkit_tests"],
    )


def _run(alias: str) -> list[str]:
    """Run ``TASKS`` trivial tasks with one worker (burst, batch 1); the statements its connection sent."""
    with backend_on(alias) as backend:
        for _ in range(TASKS):
            jobs.noop_task.enqueue()
        with CaptureQueriesContext(connections[alias]) as queries:
            stats = run_worker(backend, concurrency=1, batch=1)
        assert stats.succeeded == TASKS
        assert {str(row.status) for row in rows(alias)} == {"SUCCESSFUL"}
        assert all(row.lease_expires_at is None for row in rows(alias))
        sent = [query["sql"] for query in queries.captured_queries]
    # One statement at start, not per task: the claims held under the worker's name before it started (none here).
    started = [text for text in sent if text.startswith("SELECT") and "claimed_by" in text]
    assert len(started) == 1, sent
    assert sent.index(started[0]) <= 1, sent  # after Django's connection setup at most
    sent.remove(started[0])
    return sent


@_tx("default")
def test_postgresql_one_message_per_task() -> None:
    """A task's completion travels with the next claim: one message (and one commit) per task, plus the last claim."""
    sent = _run("default")
    assert len(sent) == TASKS + 1, sent
    # Each message after the first completes the previous task and claims the next in one transaction.
    carrying = [text for text in sent if text.count('UPDATE "lockkit_tasks_queuedtask" SET') == 2]
    assert len(carrying) == TASKS, sent


@pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON)
@_tx("default", "mariadb")
def test_mariadb_no_session_variables_per_task() -> None:
    """Per task: the claim's 4 statements and the completion's 3, none reading, setting or restoring a variable."""
    # Django's own connection setup (the test settings' isolation level) is not a claims statement: a worker with
    # CONN_MAX_AGE=0 reconnects around each task (close_old_connections).
    sent = [
        text for text in _run("mariadb") if not text.startswith("SET SESSION TRANSACTION ISOLATION LEVEL")
    ]
    settings_sent = [text for text in sent if "@@SESSION" in text or text.startswith("SET SESSION")]
    assert settings_sent == [], settings_sent
    # Two transactions per task (Django logs their BEGIN and COMMIT), and one more for the last (empty) claim. On a
    # loaded machine the heartbeat (which locks the worker's claims on its own connection) can meet a claim in a
    # deadlock: that attempt is rolled back and run again, whole.
    retried = sent.count("ROLLBACK")
    assert retried <= 2, sent
    assert sent.count("COMMIT") == TASKS * 2 + 1, sent
    assert sent.count("BEGIN") == TASKS * 2 + 1 + retried, sent
    sent = [text for text in sent if text not in ("BEGIN", "COMMIT", "ROLLBACK")]
    # Claim: candidates, lock, update, read back; completion: lock, update, read back; plus the last (empty) claim
    # (a retried attempt sent at most a claim's or a completion's statements more).
    assert TASKS * 7 + 1 <= len(sent) <= TASKS * 7 + 1 + 4 * retried, sent
    assert all(
        text.startswith("SET STATEMENT innodb_lock_wait_timeout=5, lock_wait_timeout=5 FOR ") for text in sent
    )


@pytest.mark.skipif(not MYSQL_CONFIGURED, reason=MYSQL_SKIP_REASON)
@_tx("default", "mariadb")
def test_mariadb_claims_bound_their_waits_and_leave_the_session_alone() -> None:
    """A completion waiting for a held row gives up within its lock timeout; the session's own values stay."""
    connection = connections["mariadb"]
    own = (
        "SELECT @@SESSION.innodb_lock_wait_timeout, @@SESSION.lock_wait_timeout, @@SESSION.max_statement_time"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SET SESSION innodb_lock_wait_timeout = 40, lock_wait_timeout = 41, max_statement_time = 42"
        )
        cursor.execute(own)
        before = cursor.fetchone()
    assert before == (40, 41, 42.0)
    Job.objects.using("mariadb").bulk_create([Job(name="a"), Job(name="b")])
    jobs_ = Job.objects.using("mariadb").filter(state="pending")
    (first, second) = claim_next(jobs_, worker="w", lease=30, limit=2, order_by=["name"])
    with hold_lock(Job.objects.using("mariadb").filter(pk=first.pk), timeout=20):
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            complete(first, set={"state": "done"}, lock_timeout=1)
        waited = time.monotonic() - started
    assert 0.9 < waited < 5, waited  # InnoDB's whole second, not the session's 40
    complete(first, set={"state": "done"})  # the next call on the connection works
    complete(second, set={"state": "done"})
    with connection.cursor() as cursor:
        cursor.execute(own)
        assert cursor.fetchone() == before
    assert sorted(Job.objects.using("mariadb").values_list("state", flat=True)) == ["done", "done"]
