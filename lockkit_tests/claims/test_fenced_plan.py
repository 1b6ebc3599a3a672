"""PostgreSQL: a fenced write (``complete``, ``release``, ``heartbeat``) reaches its row by the primary key.

Its test that the row still carries the claim must not be plannable as an index scan of ``claimed_by`` or of
``lease_expires_at``: statistics gathered while no row was claimed call every worker name and lease rare, and such a
plan reads every row the worker ever claimed (the task table has an index on ``claimed_by``; every claimable model
has one on ``lease_expires_at``). Asserted on the server's own plan, for one claim and for several.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from lockkit.claims import claim_next, complete
from lockkit.claims.sql import claims_sql_for
from lockkit_tests.models import Job

PG = [pytest.param("default", id="postgresql", marks=pytest.mark.django_db(transaction=True))]


@pytest.fixture
def worker_index(alias: str) -> Iterator[None]:
    """An index on ``claimed_by``, and statistics gathered while no row was claimed (as after a burst of inserts)."""
    connection = connections[alias]
    table = connection.ops.quote_name(Job._meta.db_table)
    Job.objects.using(alias).bulk_create([Job(name=f"job-{i}") for i in range(500)])
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE INDEX lockkit_test_job_worker ON {table} (claimed_by)")
        cursor.execute(f"ANALYZE {table}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX IF EXISTS lockkit_test_job_worker")


def _indexes(alias: str, sql: str, params: list[Any]) -> set[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (plan,) = cursor.fetchone()
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if "Index Name" in node:
            found.add(node["Index Name"])
        if node.get("Node Type") == "Seq Scan" and node.get("Relation Name") == Job._meta.db_table:
            found.add("seq scan")
        for child in node.get("Plans", []):
            walk(child)

    walk((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])
    return found


def _primary_key_index(alias: str) -> str:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass AND indisprimary",
            [Job._meta.db_table],
        )
        (name,) = cursor.fetchone()
    return str(name)


@pytest.mark.parametrize("alias", PG)
@pytest.mark.usefixtures("worker_index")
def test_a_fenced_write_reaches_its_row_by_the_primary_key(alias: str) -> None:
    pending = Job.objects.using(alias).filter(state="pending")
    claims = claim_next(pending, worker="w-1", lease=60, limit=400)
    assert len(claims) == 400
    statements = claims_sql_for(Job, alias)
    values = {"lease_expires_at": None, "state": "done"}
    one = statements.fenced_one(claims[0].pk, claims[0].token, claims[0].worker, values)
    assert one is not None  # one statement on PostgreSQL
    assert _indexes(alias, *one) == {_primary_key_index(alias)}
    # And the write does what it says: one row written, the other claims untouched.
    complete(claims[0], set={"state": "done"})
    assert Job.objects.using(alias).filter(state="done").count() == 1
    assert Job.objects.using(alias).filter(claimed_by="w-1", lease_expires_at__isnull=False).count() == 399
