"""Creating, seeding and resetting the benchmark's own tables (``lkbench_*``); nothing else is touched."""

from __future__ import annotations

from django.db import connection

from benchmarks.models import Item, Job
from benchmarks.ops import ROWS

INITIAL = 1_000_000_000  # units per row: never runs out during a run


def create() -> None:
    """Drop and recreate ``lkbench_item`` (seeded with ``ROWS`` rows) and ``lkbench_job`` (empty)."""
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS lkbench_item, lkbench_job")
    with connection.schema_editor() as editor:
        editor.create_model(Item)
        editor.create_model(Job)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO lkbench_item (id, available, reserved) SELECT g, %s, 0 FROM generate_series(1, %s) g",
            [INITIAL, ROWS],
        )
        cursor.execute("ANALYZE lkbench_item")


def reset_jobs(count: int) -> None:
    """Replace every job with ``count`` fresh pending ones (workload 5 runs on a full queue)."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE lkbench_job RESTART IDENTITY")
        cursor.execute(
            "INSERT INTO lkbench_job (state, claimed_by, claim_token, attempts) "
            "SELECT 'pending', '', 0, 0 FROM generate_series(1, %s)",
            [count],
        )
        cursor.execute("VACUUM ANALYZE lkbench_job")


def pending_jobs() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM lkbench_job WHERE state = 'pending'")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])
