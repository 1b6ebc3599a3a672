"""On Django < 6 (no django.tasks), importing lockkit.tasks fails at once with a message saying what to do."""

from __future__ import annotations

import importlib
import sys

import django
import pytest
from django.core.exceptions import ImproperlyConfigured


def test_import_on_django_before_6_raises_improperly_configured() -> None:
    assert django.VERSION < (6, 0)
    sys.modules.pop("lockkit.tasks", None)
    with pytest.raises(
        ImproperlyConfigured, match=r"lockkit.tasks needs Django 6.0 or later .*this is Django 5"
    ):
        importlib.import_module("lockkit.tasks")
    assert "lockkit.tasks" not in sys.modules
