"""The sample apps' migrations match their models (on every supported Django version)."""

from __future__ import annotations

import pytest
from django.core.management import call_command


@pytest.mark.django_db(databases="__all__")
def test_migrations_are_up_to_date() -> None:
    call_command("makemigrations", "inventory", "jobs", "--check", "--dry-run", verbosity=0)
