"""A Django 6 Tasks backend on lockkit.claims, and ``manage.py lockkit_worker`` to run its tasks.

``INSTALLED_APPS += ["lockkit.tasks"]`` and ``TASKS = {"default": {"BACKEND": "lockkit.tasks.DatabaseBackend"}}``;
then ``manage.py migrate`` and ``manage.py lockkit_worker``. Needs Django 6.0 or later (``django.tasks``). See
docs/tasks.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import django
from django.core.exceptions import ImproperlyConfigured

if django.VERSION < (6, 0):
    raise ImproperlyConfigured(
        f"lockkit.tasks needs Django 6.0 or later (it is a backend for django.tasks, new in Django 6.0); "
        f"this is Django {django.get_version()}. Upgrade Django, or remove 'lockkit.tasks' from "
        f"INSTALLED_APPS and TASKS."
    )

from lockkit.tasks.backend import DatabaseBackend
from lockkit.tasks.errors import ReturnValueNotRecorded, TransactionLeftOpen, WorkerLost
from lockkit.tasks.periodic.declared import periodic_task

if TYPE_CHECKING:
    from lockkit.tasks.running import current_claim, fenced

__all__ = [
    "DatabaseBackend",
    "ReturnValueNotRecorded",
    "TransactionLeftOpen",
    "WorkerLost",
    "current_claim",
    "fenced",
    "periodic_task",
]


def __getattr__(name: str) -> Any:
    """``current_claim`` and ``fenced``, imported on first use: they need Django's app registry."""
    if name in {"current_claim", "fenced"}:
        from lockkit.tasks import running

        return getattr(running, name)
    raise AttributeError(f"module 'lockkit.tasks' has no attribute {name!r}")
