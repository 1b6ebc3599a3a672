"""The admin: read-only, filtered by status/queue/backend, and "retry" running finished tasks again as new rows.

Through Django's test client with real users: one who may only view tasks, one who may change them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.apps import apps
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.sites import AdminSite
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.db.migrations.autodetector import MigrationAutodetector
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState
from django.db.models.signals import pre_delete
from django.tasks import TaskResultStatus
from django.test import Client, RequestFactory

from lockkit.claims import claim_next
from lockkit.tasks.admin import QueuedTaskAdmin
from lockkit.tasks.models import PeriodicSchedule, QueuedTask
from lockkit.tasks.periodic.firing import Periodic
from lockkit_tests.support.util import run_threads
from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import APPS, backend_on, run_worker, vendor_aliases

ADMIN_APPS = [*APPS, "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes"]
ADMIN_APPS += ["django.contrib.sessions", "django.contrib.messages"]
on_postgresql = pytest.mark.django_db(transaction=True, databases=["default"], available_apps=ADMIN_APPS)
CHANGELIST = "/admin/lockkit_tasks/queuedtask/"


def test_migrations_match_the_models() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    detector = MigrationAutodetector(loader.project_state(), ProjectState.from_apps(apps))
    assert detector.changes(graph=loader.graph, trim_to_apps={"lockkit_tasks"}) == {}


def test_admin_configuration_passes_djangos_checks() -> None:
    assert QueuedTaskAdmin(QueuedTask, AdminSite()).check() == []


def test_admin_is_read_only() -> None:
    model_admin = QueuedTaskAdmin(QueuedTask, AdminSite())
    request = RequestFactory().get("/")
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    # Every field, errors shown by attempt (a traceback each).
    assert set(model_admin.get_readonly_fields(request)) == {
        "errors_by_attempt" if f.name == "errors" else f.name for f in QueuedTask._meta.fields
    }
    assert model_admin.list_filter == ("status", "queue_name", "backend_name")


def _staff(name: str, *codenames: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="lockkit_tasks", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def _retry(client: Client, *ids: str, confirm: bool = False, follow: bool = False) -> Any:
    data: dict[str, Any] = {"action": "retry", ACTION_CHECKBOX_NAME: list(ids), "index": 0}
    if confirm:
        data["post"] = "yes"
    return client.post(CHANGELIST, data, follow=follow)


def _snapshot(pk: str) -> dict[str, Any]:
    row = QueuedTask.objects.using("default").get(pk=pk)
    return {
        "status": row.status,
        "errors": row.errors,
        "worker_log": row.worker_log,
        "value": row.return_value,
    }


@on_postgresql
def test_a_view_only_user_cannot_retry() -> None:
    with backend_on("default", max_attempts=1) as backend:
        failed = jobs.failing_task_value_error.enqueue()
        run_worker(backend)
        before = _snapshot(failed.id)
        viewer = _staff("viewer", "view_queuedtask")
        assert viewer.get(CHANGELIST).status_code == 200  # the viewer sees the list...
        response = _retry(viewer, failed.id, confirm=True, follow=True)
        assert response.status_code == 200  # the list again: no action is offered to a viewer, none ran
        assert 'value="retry"' not in viewer.get(CHANGELIST).content.decode()
        assert QueuedTask.objects.using("default").count() == 1
        assert _snapshot(failed.id) == before


@on_postgresql
def test_retry_keeps_the_earlier_run_and_links_the_new_one() -> None:
    with backend_on("default", max_attempts=1) as backend:
        failed = jobs.failing_task_value_error.enqueue()
        run_worker(backend)
        before = _snapshot(failed.id)
        assert before["status"] == TaskResultStatus.FAILED
        assert len(before["errors"]) == 1
        changer = _staff("changer", "view_queuedtask", "change_queuedtask")
        response = _retry(changer, failed.id)  # not succeeded: no confirmation needed
        assert response.status_code == 302
        assert _snapshot(failed.id) == before  # the earlier run's record is untouched
        rerun = QueuedTask.objects.using("default").get(retry_of=failed.id)
        assert rerun.status == TaskResultStatus.READY
        assert (rerun.task_path, rerun.args_kwargs) == (
            "lockkit_tests.tasks.jobs.failing_task_value_error",
            {"args": [], "kwargs": {}},
        )
        assert list(run_worker(backend).ids) == [str(rerun.pk)]
        rerun.refresh_from_db()
        assert rerun.status == TaskResultStatus.FAILED
        assert len(rerun.worker_ids) == 1
        assert len(rerun.errors) == 1
        # Retried once already: selecting it again does nothing (retry the newest run instead).
        _retry(changer, failed.id)
        assert QueuedTask.objects.using("default").count() == 2


@on_postgresql
def test_retrying_a_succeeded_task_asks_for_confirmation_first() -> None:
    with backend_on("default") as backend:
        done = jobs.calculate_meaning_of_life.enqueue()
        run_worker(backend)
        before = _snapshot(done.id)
        changer = _staff("changer", "view_queuedtask", "change_queuedtask")
        page = _retry(changer, done.id)
        assert page.status_code == 200
        text = page.content.decode()
        assert "already succeeded" in text
        assert str(done.id) in text
        assert 'name="post" value="yes"' in text
        assert QueuedTask.objects.using("default").count() == 1  # nothing yet
        assert _snapshot(done.id) == before
        assert _retry(changer, done.id, confirm=True).status_code == 302
        assert _snapshot(done.id) == before
        rerun = QueuedTask.objects.using("default").get(retry_of=done.id)
        assert list(run_worker(backend).ids) == [str(rerun.pk)]
        rerun.refresh_from_db()
        assert (rerun.status, rerun.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


class RecordingAdmin(QueuedTaskAdmin):
    """The real admin, recording its messages instead of needing the messages middleware."""

    messages: list[str]

    def message_user(self, request: Any, message: Any, *args: Any, **kwargs: Any) -> None:
        self.messages.append(str(message))


@pytest.mark.parametrize("alias", vendor_aliases())
def test_retry_action_enqueues_finished_tasks_again_and_leaves_others(alias: str) -> None:
    with backend_on(alias, max_attempts=1) as backend:
        failed = jobs.failing_task_value_error.enqueue()
        done = jobs.calculate_meaning_of_life.enqueue()
        run_worker(backend)
        waiting = jobs.noop_task.enqueue()
        model_admin = RecordingAdmin(QueuedTask, AdminSite())
        model_admin.messages = []
        request = RequestFactory().post("/", {"post": "yes"})
        assert model_admin.retry(request, QueuedTask.objects.using(alias).all()) is None
        assert model_admin.messages == [
            "2 task(s) will run again, as new tasks.",
            "1 selected task(s) left as they are: not finished, or already run again (retry the newest run).",
        ]
        rows = {str(row.pk): row for row in QueuedTask.objects.using(alias)}
        assert len(rows) == 5
        assert (rows[failed.id].status, rows[done.id].status) == (TaskResultStatus.FAILED, "SUCCESSFUL")
        again = {str(row.retry_of): str(row.pk) for row in rows.values() if row.retry_of}
        assert set(again) == {failed.id, done.id}
        assert sorted(run_worker(backend).ids) == sorted([*again.values(), waiting.id])
        assert QueuedTask.objects.using(alias).get(pk=again[done.id]).return_value == 42


@on_postgresql
def test_a_running_task_cannot_be_deleted_while_a_finished_one_can() -> None:
    with backend_on("default", max_attempts=1) as backend:
        finished = jobs.failing_task_value_error.enqueue()
        run_worker(backend)
        running = jobs.noop_task.enqueue()
        QueuedTask.objects.using("default").filter(pk=running.id).update(status=TaskResultStatus.RUNNING)
        deleter = _staff("deleter", "view_queuedtask", "delete_queuedtask")
        data = {"action": "delete_selected", ACTION_CHECKBOX_NAME: [running.id], "post": "yes"}
        # "Delete selected" leaves the running task and says why (not a bare 403).
        response = deleter.post(CHANGELIST, data, follow=True)
        assert response.status_code == 200
        assert "1 running task(s) not deleted" in response.content.decode()
        assert QueuedTask.objects.using("default").filter(pk=running.id).exists()
        # Its own delete page sends the user back to the task with the same message; nothing is deleted.
        response = deleter.post(f"{CHANGELIST}{running.id}/delete/", {"post": "yes"})
        assert (response.status_code, response["Location"]) == (302, f"{CHANGELIST}{running.id}/change/")
        assert QueuedTask.objects.using("default").filter(pk=running.id).exists()
        # A selection of both: the finished one is deleted (after Django's own confirmation), the running one kept.
        data[ACTION_CHECKBOX_NAME] = [finished.id, running.id]
        assert deleter.post(CHANGELIST, data).status_code == 302
        assert not QueuedTask.objects.using("default").filter(pk=finished.id).exists()
        assert QueuedTask.objects.using("default").filter(pk=running.id).exists()
        # Without the delete permission there is no delete action at all, running task or not.
        viewer = _staff("viewer", "view_queuedtask")
        assert viewer.post(CHANGELIST, data).status_code in (200, 302)
        assert QueuedTask.objects.using("default").filter(pk=running.id).exists()


def _worker_claims_during_delete(claimed: list[Any]) -> Callable[..., None]:
    """A ``pre_delete`` receiver: between Django's read of the rows and its ``DELETE``, a worker (another
    connection, in a thread) claims every ready task it can, as the tasks worker does (``SKIP LOCKED``)."""

    def receiver(sender: Any, **kwargs: Any) -> None:
        def claim(_: int) -> None:
            try:
                ready = QueuedTask.objects.using("default").filter(status=TaskResultStatus.READY)
                claimed.extend(claim_next(ready, worker="w", lease=30, limit=10, set={"status": "RUNNING"}))
            finally:
                connections.close_all()

        run_threads(claim, 1, timeout=30)

    return receiver


@on_postgresql
@pytest.mark.parametrize("page", ["delete selected", "delete page"])
def test_a_worker_cannot_claim_a_task_the_admin_is_deleting(page: str) -> None:
    """The confirming request locks the rows from its read to its commit: a worker claiming meanwhile passes them
    by, so the task Django checked, logged and reported is the task deleted, never one started since (before, a
    task claimed between the read and the ``DELETE`` was deleted under its running worker: a review helper)."""
    with backend_on("default"):
        task = jobs.noop_task.enqueue()
        deleter = _staff("deleter", "view_queuedtask", "delete_queuedtask")
        claimed: list[Any] = []
        receiver = _worker_claims_during_delete(claimed)
        pre_delete.connect(receiver, sender=QueuedTask, weak=False)
        try:
            if page == "delete selected":
                data = {"action": "delete_selected", ACTION_CHECKBOX_NAME: [task.id], "post": "yes"}
                response = deleter.post(CHANGELIST, data, follow=True)
                assert "Successfully deleted 1 " in response.content.decode()
            else:
                response = deleter.post(f"{CHANGELIST}{task.id}/delete/", {"post": "yes"})
                assert response.status_code == 302  # Django's answer to a delete done
        finally:
            pre_delete.disconnect(receiver, sender=QueuedTask)
        assert claimed == []
        assert not QueuedTask.objects.using("default").filter(pk=task.id).exists()


@on_postgresql
def test_a_running_tasks_delete_page_redirects_only_users_who_may_see_it() -> None:
    with backend_on("default"):
        running = jobs.noop_task.enqueue()
        QueuedTask.objects.using("default").filter(pk=running.id).update(status=TaskResultStatus.RUNNING)
        page = f"{CHANGELIST}{running.id}/delete/"
        # Delete without view: Django's own answer, not a redirect to a page the user cannot open.
        assert _staff("deleter", "delete_queuedtask").get(page).status_code == 403
        assert _staff("viewer", "view_queuedtask").get(page).status_code == 403
        response = _staff("both", "view_queuedtask", "delete_queuedtask").get(page, follow=True)
        assert response.redirect_chain == [(f"{CHANGELIST}{running.id}/change/", 302)]
        assert "1 running task(s) not deleted" in response.content.decode()
        assert QueuedTask.objects.using("default").filter(pk=running.id).exists()


@on_postgresql
def test_a_tasks_errors_show_as_a_traceback_per_attempt() -> None:
    """Not the stored JSON with its escaped newlines (a new user's trial)."""
    with backend_on("default", max_attempts=1) as backend:
        failed = jobs.failing_task_value_error.enqueue()
        run_worker(backend)
        viewer = _staff("viewer", "view_queuedtask")
        page = viewer.get(f"{CHANGELIST}{failed.id}/change/").content.decode()
        assert (
            "<strong>Attempt 1</strong>: builtins.ValueError</p><pre>Traceback (most recent call last):\n"
            in page
        )
        assert "ValueError: This task failed due to ValueError\n</pre>" in page
        assert '\\n  File \\"' not in page  # the JSON's escapes are gone
        assert "&quot;traceback&quot;" not in page  # nor the stored JSON itself, shown as a field of its own
        assert 'class="form-row field-errors"' not in page
        assert page.count("field-errors_by_attempt") == 1
        # A row lockkit did not write (errors not a list of records) is shown as it is, not a server error.
        QueuedTask.objects.filter(pk=failed.id).update(errors={"<b>x</b>": 1})
        response = viewer.get(f"{CHANGELIST}{failed.id}/change/")
        assert response.status_code == 200
        assert "<pre>{&#x27;&lt;b&gt;x&lt;/b&gt;&#x27;: 1}</pre>" in response.content.decode()


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"], available_apps=ADMIN_APPS)
def test_the_admin_lists_the_tasks_of_the_task_table_s_database() -> None:
    """``OPTIONS["database"]`` names another alias (no router): the list and a task's page read it there (found by
    a review: the list was empty and the task's page redirected)."""
    with backend_on("sqlite", max_attempts=1) as backend:
        failed = jobs.failing_task_value_error.enqueue()
        run_worker(backend)
        assert not QueuedTask.objects.using("default").exists()
        staff = _staff("operator", "view_queuedtask", "change_queuedtask")
        listing = staff.get(CHANGELIST)
        assert listing.status_code == 200
        assert failed.id in listing.content.decode()
        page = staff.get(f"{CHANGELIST}{failed.id}/change/")
        assert page.status_code == 200
        assert "ValueError" in page.content.decode()
        _retry(staff, failed.id, follow=True)
        again = QueuedTask.objects.using("sqlite").get(retry_of=failed.id)
        assert again.status == TaskResultStatus.READY


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"], available_apps=ADMIN_APPS)
def test_the_admin_lists_the_periodic_schedules_of_the_task_table_s_database() -> None:
    """``OPTIONS["database"]`` names another alias (no router): the schedules' list, a schedule's page and its
    delete read and delete there (before, the list showed 0 schedules and a schedule's page redirected)."""
    schedules = "/admin/lockkit_tasks/periodicschedule/"
    periodic = {"nightly": {"task": "lockkit_tests.tasks.jobs.noop_task", "cron": "0 3 * * *"}}
    with backend_on("sqlite", periodic=periodic) as backend:
        Periodic(backend, "sqlite").fire_due()  # the schedule's row, as a worker writes it
        row = PeriodicSchedule.objects.using("sqlite").get()
        assert not PeriodicSchedule.objects.using("default").exists()
        staff = _staff("operator", "view_periodicschedule", "delete_periodicschedule")
        listing = staff.get(schedules)
        assert listing.status_code == 200
        assert "1 periodic schedule" in listing.content.decode()
        assert "nightly" in listing.content.decode()
        page = staff.get(f"{schedules}{row.pk}/change/")
        assert page.status_code == 200
        assert "0 3 * * *" in page.content.decode()
        assert staff.post(f"{schedules}{row.pk}/delete/", {"post": "yes"}).status_code == 302
        assert not PeriodicSchedule.objects.using("sqlite").exists()
