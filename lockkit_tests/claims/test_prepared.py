"""Prepared statements for the statements a worker repeats (``lockkit._engine.prepared``), on real sessions.

Inside ``preparing()`` (the tasks worker's claims), a one-message statement sent a second time on a session is
prepared there with ``PREPARE`` and sent as ``EXECUTE`` from then on. Each test checks what was sent and what the
rows hold: the claims made, in order, one per call, with nothing claimed twice, also after the session lost its
prepared statements, after the table changed shape, behind a transaction-mode PgBouncer whose server session
changed, and for a statement PostgreSQL cannot prepare.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL
from django.test.utils import CaptureQueriesContext

from lockkit._engine.prepared import numbered, preparing
from lockkit.claims import claim_next, complete
from lockkit_tests.models import Job
from lockkit_tests.support.faultkit import behind_pgbouncer

pytestmark = pytest.mark.django_db(transaction=True)


def _sent(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries]


def _prepared_here(alias: str = "default") -> list[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements ORDER BY name")
        return [name for (name,) in cursor.fetchall()]


def _claim(queryset: Any, worker: str = "w") -> list[str]:
    return [job.name for job, _ in claim_next(queryset, worker=worker, lease=30, fetch=True)]


@pytest.fixture
def jobs() -> list[Job]:
    return Job.objects.bulk_create([Job(name=f"j{index}") for index in range(6)])


def test_numbered_turns_placeholders_into_parameters_and_refuses_other_forms() -> None:
    assert numbered("UPDATE t SET a = %s WHERE b LIKE '50%%' AND c = %s") == (
        "UPDATE t SET a = $1 WHERE b LIKE '50%' AND c = $2"
    )
    assert numbered("SELECT %(name)s") is None
    assert numbered("SELECT $$x$$, %s") is None


def test_a_statement_sent_again_is_prepared_once_then_executed(jobs: list[Job]) -> None:
    pending = Job.objects.filter(state="pending").order_by("pk")
    with preparing(), CaptureQueriesContext(connection) as queries:
        names = [_claim(pending) for _ in range(4)]
    assert names == [["j0"], ["j1"], ["j2"], ["j3"]]
    first, prepare, second, third, fourth = _sent(queries)
    assert "EXECUTE" not in first
    assert "UPDATE" in first
    assert prepare.startswith("PREPARE lockkit_")
    assert "$1" in prepare
    assert "%s" not in prepare
    name = prepare.split()[1]
    for message in (second, third, fourth):
        assert f"EXECUTE {name}(" in message, message
        assert message.endswith("; COMMIT"), message
    assert _prepared_here() == [name]
    claimed = Job.objects.filter(claimed_by="w").order_by("pk")
    assert [(job.name, job.claim_token, job.attempts) for job in claimed] == [
        (f"j{i}", 1, 1) for i in range(4)
    ]


def test_outside_preparing_nothing_is_prepared(jobs: list[Job]) -> None:
    pending = Job.objects.filter(state="pending").order_by("pk")
    with CaptureQueriesContext(connection) as queries:
        names = [_claim(pending) for _ in range(3)]
    assert names == [["j0"], ["j1"], ["j2"]]
    assert not any("PREPARE" in sql or "EXECUTE" in sql for sql in _sent(queries))
    assert _prepared_here() == []


def test_a_session_that_lost_them_sends_the_message_again_as_text_and_claims_once(jobs: list[Job]) -> None:
    pending = Job.objects.filter(state="pending").order_by("pk")
    with preparing():
        assert [_claim(pending), _claim(pending)] == [["j0"], ["j1"]]
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")  # as a pooler's DISCARD ALL would
        with CaptureQueriesContext(connection) as queries:
            assert _claim(pending) == ["j2"]
            assert _claim(pending) == ["j3"]
    assert not any(sql.startswith("PREPARE") for sql in _sent(queries))  # not prepared again on this session
    assert not any("EXECUTE" in sql for sql in _sent(queries)[1:])
    claimed = Job.objects.filter(claimed_by="w").order_by("pk")
    assert [(job.name, job.claim_token) for job in claimed] == [(f"j{i}", 1) for i in range(4)]
    assert Job.objects.exclude(claimed_by="w").count() == 2


def test_a_table_that_changed_shape_is_claimed_from_with_the_new_shape(jobs: list[Job]) -> None:
    pending = Job.objects.filter(state="pending").order_by("pk")
    table = connection.ops.quote_name(Job._meta.db_table)
    try:
        with preparing():
            assert [_claim(pending), _claim(pending)] == [["j0"], ["j1"]]
            with connection.cursor() as cursor:  # the returned column's type changes: 0A000 for the old plan
                cursor.execute(f"ALTER TABLE {table} ALTER COLUMN name TYPE varchar(41)")
            with CaptureQueriesContext(connection) as queries:
                assert _claim(pending) == ["j2"]
            assert _claim(pending) == ["j3"]
        refused, deallocate, again = _sent(queries)  # the EXECUTE refused, its statement freed, sent as text
        assert "EXECUTE" in refused
        assert deallocate.startswith("DEALLOCATE lockkit_")
        assert "EXECUTE" not in again
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} ALTER COLUMN name TYPE varchar(40)")
    assert list(Job.objects.filter(claimed_by="w").order_by("pk").values_list("name", "claim_token")) == [
        (f"j{i}", 1) for i in range(4)
    ]


def test_a_statement_postgresql_cannot_prepare_is_sent_as_text(jobs: list[Job]) -> None:
    # "$1 IS NULL": no type to infer for the parameter, so PREPARE is refused; the claim goes as text.
    untyped = RawSQL("%s IS NULL", (None,), output_field=BooleanField())
    pending = Job.objects.filter(untyped, state="pending").order_by("pk")
    with preparing(), CaptureQueriesContext(connection) as queries:
        names = [_claim(pending) for _ in range(3)]
    assert names == [["j0"], ["j1"], ["j2"]]
    sent = _sent(queries)
    assert sum(sql.startswith("PREPARE") for sql in sent) == 1  # tried once, then never again
    assert not any("EXECUTE" in sql for sql in sent)
    assert _prepared_here() == []


@pytest.fixture
def bouncer() -> Iterator[str]:
    with behind_pgbouncer("default", {}) as alias:
        yield alias
        connections[alias].close()


@pytest.mark.django_db(transaction=True, databases=["default", "bouncer"])
def test_behind_a_pooler_whose_server_session_changed_every_claim_is_made_once(
    jobs: list[Job], bouncer: str
) -> None:
    pending = Job.objects.using(bouncer).filter(state="pending").order_by("pk")
    with preparing():
        assert [_claim(pending), _claim(pending), _claim(pending)] == [["j0"], ["j1"], ["j2"]]
        with connections[bouncer].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (server,) = cursor.fetchone()
        with connection.cursor() as cursor:  # PgBouncer's server session ends: the next goes to a new one
            cursor.execute("SELECT pg_terminate_backend(%s)", [server])
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [server]
            )  # ends asynchronously: wait until it is gone
            for _ in range(200):
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [server])
                if cursor.fetchone() == (0,):
                    break
                cursor.execute("SELECT pg_sleep(0.01)")
        with CaptureQueriesContext(connections[bouncer]) as queries:
            found = [_claim(pending) for _ in range(3)]
    assert found == [["j3"], ["j4"], ["j5"]]
    refused, *rest = _sent(queries)  # 26000 on the new session: the message went nowhere, sent again as text
    assert "EXECUTE lockkit_" in refused
    assert len(rest) == 3, rest
    assert not any("EXECUTE" in sql or "PREPARE" in sql for sql in rest), rest
    rows = Job.objects.filter(claimed_by="w").order_by("pk")
    assert [(job.name, job.claim_token) for job in rows] == [(f"j{i}", 1) for i in range(6)]


def test_a_worker_completion_and_claim_travel_prepared_in_one_message(jobs: list[Job]) -> None:
    from lockkit.claims.api import NextClaims
    from lockkit.claims.chaining import complete_then_claim_next

    pending = Job.objects.filter(state="pending").order_by("pk")
    with preparing():
        ((job, held),) = claim_next(pending, worker="w", lease=30, fetch=True)
        for index in range(1, 4):
            chained = complete_then_claim_next(
                held, {"state": "done"}, NextClaims(pending, worker="w", lease=30, fetch=True)
            )
            assert chained.completed
            assert chained.error is None
            ((job, held),) = chained.claimed
            assert job.name == f"j{index}"
        complete(held, set={"state": "done"})
    assert list(Job.objects.order_by("pk").values_list("state", flat=True)) == ["done"] * 4 + ["pending"] * 2
    assert len(_prepared_here()) == 2  # the completion and the claim
