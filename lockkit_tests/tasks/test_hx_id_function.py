"""Hostile tests of ``OPTIONS["id_function"]`` (h-hostile-37)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connections, transaction

from lockkit.tasks.models import QueuedTask
from lockkit_tests.support.vendors import MYSQL_CONFIGURED, MYSQL_SKIP_REASON
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, run_worker, vendor_aliases

FIXED = "0b8c2bc6-7a5e-4bfa-9d7b-1e2f3a4b5c6d"


def fixed() -> str:
    return FIXED


def braces_upper() -> str:
    return "{" + FIXED.upper() + "}"


def urn() -> str:
    return f"urn:uuid:{FIXED}"


def as_int() -> int:
    return uuid.UUID(FIXED).int


def as_bytes() -> bytes:
    return uuid.UUID(FIXED).bytes


def as_none() -> None:
    return None


def raises() -> str:
    raise RuntimeError("id_function failed")


def queries_the_database() -> str:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT gen_random_uuid()::text")
        return str(cursor.fetchone()[0])


@pytest.mark.parametrize("alias", vendor_aliases())
@pytest.mark.parametrize("made", ["braces_upper", "urn"])
def test_uuid_text_in_other_spellings_is_stored_normalized(alias: str, made: str) -> None:
    with backend_on(alias, id_function=f"{__name__}.{made}") as backend:
        result = jobs.calculate_meaning_of_life.enqueue()
        assert result.id == FIXED
        assert backend.get_result(FIXED).id == FIXED
        assert backend.get_result(braces_upper()).id == FIXED
        run_worker(backend)
        assert backend.get_result(FIXED).return_value == 42


@pytest.mark.parametrize("alias", vendor_aliases())
@pytest.mark.parametrize("made", ["as_int", "as_bytes", "as_none"])
def test_non_uuid_types_are_refused_nothing_written(alias: str, made: str) -> None:
    with backend_on(alias, id_function=f"{__name__}.{made}"):
        with pytest.raises(ImproperlyConfigured, match=r"must return a uuid\.UUID"):
            jobs.noop_task.enqueue()
    assert QueuedTask.objects.using(alias).count() == 0


@pytest.mark.parametrize("alias", vendor_aliases())
def test_an_id_function_that_raises_leaves_nothing(alias: str) -> None:
    with backend_on(alias, id_function=f"{__name__}.raises"):
        with pytest.raises(RuntimeError, match="id_function failed"):
            jobs.noop_task.enqueue()
    assert QueuedTask.objects.using(alias).count() == 0


@pytest.mark.django_db(transaction=True, databases=["default"], available_apps=APPS)
def test_an_id_function_that_queries_the_database_inside_atomic() -> None:
    with backend_on("default", id_function=f"{__name__}.queries_the_database") as backend:
        with transaction.atomic():
            result = jobs.calculate_meaning_of_life.enqueue()
        run_worker(backend)
        assert backend.get_result(result.id).return_value == 42


@pytest.mark.parametrize("alias", vendor_aliases())
def test_a_duplicate_id_in_the_task_tables_transaction_raises_at_enqueue(alias: str) -> None:
    with backend_on(alias, id_function=f"{__name__}.fixed"):
        jobs.echo.enqueue("first")
        with pytest.raises(IntegrityError):
            jobs.echo.enqueue("second")
    assert QueuedTask.objects.using(alias).count() == 1


def _deferred_marks() -> list[Any]:
    mark = pytest.mark.django_db

    def on(*databases: str) -> Any:
        return mark(transaction=True, databases=list(databases), available_apps=APPS)

    return [
        pytest.param(
            "mariadb",
            id="mariadb",
            marks=[on("default", "mariadb")]
            if MYSQL_CONFIGURED
            else [pytest.mark.skip(reason=MYSQL_SKIP_REASON)],
        ),
        pytest.param("sqlite", id="sqlite", marks=on("default", "sqlite")),
    ]


@pytest.mark.parametrize("alias", _deferred_marks())
def test_a_duplicate_id_deferred_to_the_callers_commit(alias: str) -> None:
    """Task table on ``alias``, the caller's ``atomic()`` on ``default`` (PostgreSQL): the insert runs on commit."""
    with connections["default"].cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS hx_marker (v text)")
        cursor.execute("DELETE FROM hx_marker")
    hooks: list[str] = []
    raised: list[BaseException] = []
    try:
        with backend_on(alias, id_function=f"{__name__}.fixed") as backend:
            first = jobs.echo.enqueue("first")  # no transaction open: written at once
            try:
                with transaction.atomic(using="default"):
                    with connections["default"].cursor() as cursor:
                        cursor.execute("INSERT INTO hx_marker VALUES ('caller write')")
                    second = jobs.echo.enqueue("second")  # deferred to the commit of default
                    transaction.on_commit(lambda: hooks.append("caller's own hook"), using="default")
            except BaseException as failure:
                raised.append(failure)
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT count(*) FROM hx_marker")
                committed = cursor.fetchone()[0]
            read_back = backend.get_result(second.id)
            report = {
                "atomic() raised": [type(e).__name__ for e in raised],
                "caller's write committed": committed == 1,
                "caller's later on_commit hook ran": hooks,
                "second.id == first.id": second.id == first.id,
                "get_result(second.id).args": read_back.args,
                "task rows": QueuedTask.objects.using(alias).count(),
            }
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS hx_marker")
    print(report)
    # As documented (docs/tasks.md, "Where the task table lives"): the deferred insert runs after the caller's
    # commit, so its failure is raised from the atomic() exit with the caller's work committed, the task not
    # enqueued, and the caller's later on_commit callbacks not run (Django's on_commit semantics).
    assert report == {
        "atomic() raised": ["IntegrityError"],
        "caller's write committed": True,
        "caller's later on_commit hook ran": [],
        "second.id == first.id": True,
        "get_result(second.id).args": ["first"],
        "task rows": 1,
    }
