"""Reading a result's rows keyed by column name (``lockkit._engine.message.read_rows``) on real PostgreSQL sessions.

On psycopg 3 the names come from the result itself (``pgresult.fname()``), not ``description``: the rows and the
row count must be what ``description`` would give, in every shape of result and in the session's encoding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections

from lockkit._engine.message import read_rows

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def driver() -> Iterator[Any]:
    """A psycopg client-side cursor on a session of its own (its settings end with it)."""
    wrapper = connections.create_connection("default")
    try:
        wrapper.ensure_connection()
        with psycopg.ClientCursor(wrapper.connection) as cursor:
            yield cursor
    finally:
        wrapper.close()


def _by_description(cursor: Any) -> tuple[list[dict[str, Any]], int]:
    description = cursor.description
    if description is None:
        return [], cursor.rowcount
    names = [column[0] for column in description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()], cursor.rowcount


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "SELECT 1 AS a, 'x' AS \"Größe\", NULL::int AS \"with space\" UNION ALL SELECT 2, 'y', 3",
            ([{"a": 1, "Größe": "x", "with space": None}, {"a": 2, "Größe": "y", "with space": 3}], 2),
        ),
        ("SELECT 1 AS a WHERE false", ([], 0)),
        ("SELECT", ([{}], 1)),
        ("CREATE TEMPORARY TABLE lockkit_read_rows (n int)", ([], -1)),
        ("SET lock_timeout = '1s'", ([], -1)),
    ],
)
def test_rows_are_those_description_gives(driver: Any, sql: str, expected: tuple[list[Any], int]) -> None:
    driver.execute(sql)
    assert read_rows(driver) == expected
    driver.execute(
        sql.replace("CREATE TEMPORARY TABLE lockkit_read_rows", "CREATE TEMPORARY TABLE lockkit_again")
    )
    assert _by_description(driver) == expected


def test_a_command_without_returning_gives_no_rows_and_its_count(driver: Any) -> None:
    driver.execute(
        "CREATE TEMPORARY TABLE lockkit_counted (n int); INSERT INTO lockkit_counted VALUES (1), (2), (3)"
    )
    driver.execute("UPDATE lockkit_counted SET n = n + 1 WHERE n > 1")
    assert read_rows(driver) == ([], 2)
    driver.execute("UPDATE lockkit_counted SET n = n + 1 WHERE n > 2 RETURNING n AS now")
    assert read_rows(driver) == ([{"now": 4}, {"now": 5}], 2)


def test_names_are_decoded_in_the_session_encoding(driver: Any) -> None:
    driver.execute("SET client_encoding TO 'LATIN1'")
    driver.execute('SELECT 1 AS "Größe", 2 AS "café"')
    assert read_rows(driver) == ([{"Größe": 1, "café": 2}], 1)


def test_each_result_of_a_message_is_read_in_turn(driver: Any) -> None:
    driver.execute(
        "BEGIN; SELECT 1 AS first; UPDATE pg_class SET relname = relname WHERE false; SELECT 'z' AS last; COMMIT"
    )
    results = [read_rows(driver)]
    while driver.nextset():
        results.append(read_rows(driver))
    assert results == [([], -1), ([{"first": 1}], 1), ([], 0), ([{"last": "z"}], 1), ([], -1)]


def test_names_kept_per_statement_follow_the_result_they_read(driver: Any) -> None:
    """Names kept for a statement's text are used only for a result of the same shape; otherwise read again."""
    statement = "SELECT 1 AS first, 2 AS second"
    driver.execute(statement)
    assert read_rows(driver, statement) == ([{"first": 1, "second": 2}], 1)
    driver.execute(statement)
    assert read_rows(driver, statement) == ([{"first": 1, "second": 2}], 1)
    # The same key for a result with another number of columns (a statement whose text did not change while a
    # column was added, say): its own names are read, never the kept ones.
    driver.execute("SELECT 1 AS a, 2 AS b, 3 AS c")
    assert read_rows(driver, statement) == ([{"a": 1, "b": 2, "c": 3}], 1)
    driver.execute("UPDATE pg_namespace SET nspname = nspname WHERE false")
    assert read_rows(driver, statement) == ([], 0)
