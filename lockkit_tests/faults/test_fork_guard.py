"""The fork guard (``lockkit._engine.forks``) is installed by the app's ``ready()`` or the first scope, not at import.

Each case runs in a fresh interpreter: ``import lockkit`` with settings configured but the apps not set up registers
no at-fork hook; ``django.setup()`` with ``"lockkit"`` in ``INSTALLED_APPS`` does; without the app, the first scope
does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

import lockkit

ROOT = Path(lockkit.__file__).resolve().parent.parent  # this checkout: the child imports the same lockkit

_CHILD = """
import json, sys
from django.conf import settings

settings.configure(INSTALLED_APPS={apps!r}, DATABASES={databases!r}, USE_TZ=True)
import lockkit
from lockkit._engine import forks

seen = {{"after_import": forks._installed}}
import django

django.setup()
seen["after_setup"] = forks._installed
if {scope!r}:
    with lockkit.locked("default"):
        pass
    seen["after_scope"] = forks._installed
print(json.dumps(seen))
"""


def _run(apps: list[str], databases: dict[str, Any], *, scope: bool) -> dict[str, bool]:
    code = textwrap.dedent(_CHILD.format(apps=apps, databases=databases, scope=scope))
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment.pop("DJANGO_SETTINGS_MODULE", None)  # the child configures its own settings
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen: dict[str, bool] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def test_import_installs_nothing_and_the_apps_ready_installs_the_hook() -> None:
    assert _run(["lockkit"], {}, scope=False) == {"after_import": False, "after_setup": True}


@pytest.mark.django_db(transaction=True)
def test_without_the_app_the_first_scope_installs_the_hook() -> None:
    default = dict(connections["default"].settings_dict)  # the test database pytest-django set up
    database = {key: default[key] for key in ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT")}
    seen = _run([], {"default": database}, scope=True)
    assert seen == {"after_import": False, "after_setup": False, "after_scope": True}
