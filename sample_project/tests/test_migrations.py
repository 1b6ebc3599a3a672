"""The sample apps' migrations match their models (on every supported Django version)."""

from __future__ import annotations

from django.apps import apps
from django.db.migrations.autodetector import MigrationAutodetector
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState

SAMPLE_APPS = {"inventory", "jobs"}


def test_migrations_are_up_to_date() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)  # no database: the files only
    detector = MigrationAutodetector(loader.project_state(), ProjectState.from_apps(apps))
    changes = detector.changes(graph=loader.graph, trim_to_apps=SAMPLE_APPS)
    assert {app: changes[app] for app in SAMPLE_APPS if app in changes} == {}
