"""The admin of ``lockkit.tasks``: a read-only list of tasks, filtered by status and queue, and a "retry" action."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth import get_permission_codename
from django.db import DatabaseError, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.tasks.base import TaskResultStatus
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from lockkit.tasks import results
from lockkit.tasks.backend import DatabaseBackend, task_database
from lockkit.tasks.models import QueuedTask

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[QueuedTask]
else:  # ModelAdmin is generic for type checkers only (django-stubs); at run time it takes no subscript
    _ModelAdmin = admin.ModelAdmin

#: The page that asks before tasks that already succeeded run again.
CONFIRMATION_TEMPLATE = "admin/lockkit_tasks/queuedtask/retry_confirmation.html"


class QueuedTaskAdmin(_ModelAdmin):
    """Tasks as workers left them: read-only (workers own the rows), with "retry" for finished ones.

    "Retry" needs the change permission on tasks; it enqueues each selected finished task again as a new row whose
    ``retry_of`` is the old row's id, which keeps its record (status, errors, workers, return value) untouched.
    A task that already succeeded runs again only after a confirmation page.
    """

    list_display = (
        "id",
        "task_name",
        "status",
        "queue_name",
        "priority",
        "attempts",
        "enqueued_at",
        "finished_at",
        "retry_of",
    )
    list_filter = ("status", "queue_name", "backend_name")
    search_fields = ("id", "task_path", "claimed_by", "retry_of")
    ordering = ("-enqueued_at",)
    actions = ("retry", "delete_selected")
    # Shown as errors_by_attempt (a read-only field in its place), not also as the stored JSON in the form.
    exclude = ("errors",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[QueuedTask]:
        """The tasks on the task table's database (``OPTIONS["database"]`` of the lockkit backends).

        When the backends name one alias, that one (as Django's multiple-database admin does:
        https://docs.djangoproject.com/en/stable/topics/db/multi-db/#exposing-multiple-databases-in-django-s-admin-interface);
        else what the routers say.
        """
        return super().get_queryset(request).using(task_database())

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Tasks are enqueued by code, never added by hand."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: QueuedTask | None = None) -> bool:
        """Read-only: a worker may be writing the row."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: QueuedTask | None = None) -> bool:
        """Django's delete permission, never for a ``RUNNING`` task: its worker owns the row until it ends."""
        if obj is not None and obj.status == TaskResultStatus.RUNNING:
            return False
        return super().has_delete_permission(request, obj)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Django's delete page, with the task's row locked from the confirming request's read to its commit.

        For a ``RUNNING`` task, users who may delete and view tasks get a message on the task's page instead of
        "403 Forbidden". Locked, the row is passed by a worker's claim (``SKIP LOCKED``) until the delete
        commits, so what Django checks, logs and reports is what it deletes.
        """
        using = task_database()
        with transaction.atomic(using=using):
            obj = self.get_object(request, object_id)
            if obj is not None and request.method == "POST":
                obj = self.model._default_manager.using(using).select_for_update().filter(pk=obj.pk).first()
            if (
                obj is not None
                and obj.status == TaskResultStatus.RUNNING
                and super().has_delete_permission(request)
                and self.has_view_permission(request, obj)
            ):
                self.message_user(request, _running_message(1), messages.WARNING)
                url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[obj.pk])
                return HttpResponseRedirect(url)
            return super().delete_view(request, object_id, extra_context)

    @admin.action(description="Delete selected tasks (not running ones)", permissions=["delete"])
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[QueuedTask]
    ) -> TemplateResponse | None:
        """Django's "delete selected" for the tasks that are not ``RUNNING`` (the others left, and said so).

        The confirming request locks the rows it deletes, from its read to its commit: a worker's claim
        (``SKIP LOCKED``) passes them by, so what Django checks, logs and reports is what it deletes.
        """
        running = queryset.filter(status=TaskResultStatus.RUNNING).count()
        if running:
            self.message_user(request, _running_message(running), messages.WARNING)
        queryset = queryset.exclude(status=TaskResultStatus.RUNNING)
        if not request.POST.get("post"):  # the confirmation page: nothing is deleted by this request
            return django_delete_selected(self, request, queryset) if queryset.exists() else None
        with transaction.atomic(using=queryset.db):
            selected = queryset.count()
            pks = list(queryset.select_for_update().values_list("pk", flat=True))
            if len(pks) < selected:
                self.message_user(
                    request,
                    f"{selected - len(pks)} task(s) started running after they were selected: not deleted.",
                    messages.WARNING,
                )
            if not pks:
                return None
            locked = self.model._default_manager.using(queryset.db).filter(pk__in=pks)
            response: TemplateResponse | None = django_delete_selected(self, request, locked)
            return response

    def has_retry_permission(self, request: HttpRequest) -> bool:
        """Whether the user may run tasks again: Django's change permission on tasks (view is not enough)."""
        codename = get_permission_codename("change", self.opts)
        user: Any = request.user  # a User, or AnonymousUser: both have has_perm()
        return bool(user.has_perm(f"{self.opts.app_label}.{codename}"))

    def get_readonly_fields(self, request: HttpRequest, obj: QueuedTask | None = None) -> Any:
        """Every field; ``errors`` shown as one traceback per attempt (``errors_by_attempt``)."""
        return ["errors_by_attempt" if f.name == "errors" else f.name for f in self.model._meta.fields]

    @admin.display(description="Errors")
    def errors_by_attempt(self, obj: QueuedTask) -> str:
        """Each failed attempt's number, exception class and traceback, as text (not the stored JSON)."""
        errors = obj.errors
        if not errors:
            return "-"
        if not isinstance(errors, list) or not all(isinstance(error, dict) for error in errors):
            return format_html("<pre>{}</pre>", repr(errors))  # a row lockkit did not write: shown as it is
        return format_html_join(
            "",
            "<p><strong>Attempt {}</strong>: {}</p><pre>{}</pre>",
            (
                (
                    error.get("attempt", "?"),
                    error.get("exception_class_path", "?"),
                    error.get("traceback", ""),
                )
                for error in errors
            ),
        )

    @admin.action(description="Retry the selected finished tasks", permissions=["retry"])
    def retry(self, request: HttpRequest, queryset: QuerySet[QueuedTask]) -> TemplateResponse | None:
        """Enqueue the selected ``FAILED``/``SUCCESSFUL`` tasks again, each as a new row linked by ``retry_of``.

        Running, waiting and already retried tasks are left. When a selected task already succeeded, the first
        request answers with a confirmation page; the action runs when that page's form is posted.
        """
        finished = queryset.filter(
            status__in=(TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL), lease_expires_at__isnull=True
        ).exclude(
            pk__in=QueuedTask.objects.using(queryset.db).filter(retry_of__isnull=False).values("retry_of")
        )
        succeeded = [row for row in finished if row.status == TaskResultStatus.SUCCESSFUL]
        if succeeded and request.POST.get("post") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": "Run tasks that already succeeded again?",
                "opts": self.opts,
                "succeeded": succeeded,
                "selected": queryset.values_list("pk", flat=True),
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
                "action": "retry",
            }
            return TemplateResponse(request, CONFIRMATION_TEMPLATE, context)
        left = queryset.count() - len(finished)  # counted before the new rows exist
        enqueued, refused = 0, []
        for row in finished:
            try:
                _enqueue_again(row)
                enqueued += 1
            except (
                Exception,
                DatabaseError,
            ) as failure:  # one bad row (a path refused, a race) leaves the rest
                refused.append(f"{row.id}: {failure}")
        self.message_user(request, f"{enqueued} task(s) will run again, as new tasks.", messages.SUCCESS)
        if left:
            self.message_user(
                request,
                f"{left} selected task(s) left as they are: not finished, or already run again (retry the newest run).",
                messages.WARNING,
            )
        if refused:
            self.message_user(request, f"Not run again: {'; '.join(refused)}", messages.ERROR)
        return None


def _running_message(count: int) -> str:
    return (
        f"{count} running task(s) not deleted: the worker that runs a task owns its row until the task ends "
        "(delete it once it has finished)."
    )


def _enqueue_again(row: QueuedTask) -> None:
    """Enqueue ``row``'s task with its arguments as a new row linked to it (one transaction).

    Raises:
        django.tasks.exceptions.InvalidTask, ImportError, SuspiciousOperation: as ``results.task_of``.
        django.db.IntegrityError: the row was run again meanwhile (``retry_of`` is unique).
    """
    task = results.task_of(row)
    backend = task.get_backend()
    if not isinstance(backend, DatabaseBackend):
        raise TypeError(f"backend {row.backend_name!r} is not a lockkit.tasks.DatabaseBackend any more")
    alias = backend.database()
    args, kwargs = row.arguments()
    with transaction.atomic(using=alias):
        again = task.enqueue(*args, **kwargs)
        QueuedTask.objects.using(alias).filter(pk=again.id).update(retry_of=row.pk)


# Django imports admin.py only when django.contrib.admin is installed; the check lets the class be imported anyway.
if apps.is_installed("django.contrib.admin"):
    admin.site.register(QueuedTask, QueuedTaskAdmin)

# The periodic schedules' admin (registered on import).
from lockkit.tasks.periodic import admin as periodic_admin  # noqa: E402, F401
