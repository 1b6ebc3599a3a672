"""A success carried with the next claim (PostgreSQL, ``--concurrency 1 --claim-batch 1``) that the database refuses.

The message (the completion, then the claim) is rolled back as a whole: the success is then written on its own and
the claim made on its own at once, without the worker reporting that claiming failed or dropping its connection.
"""

from __future__ import annotations

import logging

import pytest
from django.db import connections
from django.tasks import TaskResultStatus

from lockkit.tasks.models import QueuedTask
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, run_worker, vendor_aliases

POSTGRESQL = [param for param in vendor_aliases() if param.id == "postgresql"]

# Refuses the first update of a task to SUCCESSFUL only: a sequence is not rolled back with the refused transaction.
CREATE = [
    "CREATE SEQUENCE hx_carried_once",
    """
    CREATE OR REPLACE FUNCTION hx_refuse_first_success() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF OLD.status = 'RUNNING' AND NEW.status = 'SUCCESSFUL' AND nextval('hx_carried_once') = 1 THEN
            RAISE EXCEPTION 'the test refuses the first success';
        END IF;
        RETURN NEW;
    END $$
    """,
    "CREATE TRIGGER hx_carried BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION hx_refuse_first_success()",
]
DROP = [
    "DROP TRIGGER IF EXISTS hx_carried ON {table}",
    "DROP FUNCTION IF EXISTS hx_refuse_first_success()",
    "DROP SEQUENCE IF EXISTS hx_carried_once",
]


def _sql(alias: str, statements: list[str]) -> None:
    table = connections[alias].ops.quote_name(QueuedTask._meta.db_table)
    with connections[alias].cursor() as cursor:
        for statement in statements:
            cursor.execute(statement.format(table=table))


@pytest.mark.parametrize("alias", POSTGRESQL)
def test_a_refused_carried_success_is_written_alone_and_the_claim_made_at_once(
    alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    with backend_on(alias) as backend:
        results = [jobs.calculate_meaning_of_life.enqueue() for _ in range(3)]
        _sql(alias, DROP)
        _sql(alias, CREATE)
        try:
            with caplog.at_level(logging.INFO, logger="lockkit"):
                stats = run_worker(backend, concurrency=1, batch=1)
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT last_value, is_called FROM hx_carried_once")
                refusals = cursor.fetchone()
        finally:
            _sql(alias, DROP)
        # The first carried success was refused (the sequence moved), then every task succeeded, each run once.
        assert refusals is not None
        assert refusals[1] is True
        assert refusals[0] >= 2
        assert (stats.succeeded, stats.failed) == (3, 0)
        rows = {str(row.pk): row for row in QueuedTask.objects.using(alias).all()}
        for result in results:
            row = rows[result.id]
            assert (row.status, row.return_value, row.attempts, row.lease_expires_at) == (
                TaskResultStatus.SUCCESSFUL,
                42,
                1,
                None,
            )
        messages = [record.getMessage() for record in caplog.records]
        assert not [m for m in messages if "claiming failed" in m], messages
        assert [m for m in messages if "was refused: the test refuses the first success" in m], messages
