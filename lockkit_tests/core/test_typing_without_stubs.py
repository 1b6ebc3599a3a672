"""The scope's model-typed signatures without django-stubs: ``Any``, never ``Never``; with django-stubs: the model.

Without django-stubs a type checker sees Django as untyped (``models.Model`` is ``Any``); a project in that state
must still be able to call ``scope.get(Job, pk=1)`` and use the result. The venv's mypy runs in subprocesses on a
small snippet, once as such a project sees lockkit (no site-packages, so no django-stubs; Django's modules missing,
so ``Any``; lockkit's own errors hidden as an installed package's are), once with the django-stubs plugin as
lockkit's own CI runs it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """
import lockkit
from lockkit_tests.models import Job


def use(job: Job) -> None:
    with lockkit.locked() as scope:
        reveal_type(scope.get(Job, pk=1))  # get model
        reveal_type(scope.get(Job.objects.filter(state="pending"), pk=1))  # get queryset
        reveal_type(scope.get(job))  # get instance
        reveal_type(scope.lock_all(Job, pks=[1, 2]))  # lock_all
        reveal_type(scope.lock(job))  # scope.lock
        reveal_type(lockkit.lock(Job))  # lockkit.lock
        scope.get(Job, pk=1).name.upper()  # used as a model: no error either way
"""

WITHOUT_STUBS = f"""
[mypy]
strict = True
warn_unused_ignores = False
disallow_subclassing_any = False
no_site_packages = True
ignore_missing_imports = True
mypy_path = {ROOT}

[mypy-lockkit.*,lockkit_tests.*]
ignore_errors = True
"""

WITH_STUBS = f"""
[mypy]
strict = True
warn_unused_ignores = False
mypy_path = {ROOT}
plugins = mypy_django_plugin.main

[mypy.plugins.django-stubs]
django_settings_module = lockkit_tests.settings

[mypy-lockkit.*,lockkit_tests.*]
ignore_errors = True
"""


def reveal(tmp_path: Path, name: str, config: str) -> subprocess.Popen[str]:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "snippet.py").write_text(textwrap.dedent(SNIPPET).lstrip("\n"))
    (folder / "mypy.ini").write_text(textwrap.dedent(config))
    return subprocess.Popen(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", "cache", "snippet.py"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def revealed(process: subprocess.Popen[str]) -> tuple[dict[str, str], str]:
    """The revealed type per snippet comment, and mypy's whole output."""
    output, _ = process.communicate(timeout=120)
    lines = textwrap.dedent(SNIPPET).lstrip("\n").splitlines()
    types = {}
    for match in re.finditer(r'snippet\.py:(\d+): note: Revealed type is "(.*)"', output):
        types[lines[int(match.group(1)) - 1].split("# ")[-1]] = match.group(2)
    return types, output


def test_model_typed_results_are_any_without_django_stubs_and_the_model_with_them(tmp_path: Path) -> None:
    # Both checks at once, in two processes: 10-35 s together on a cold cache (the plugin loads Django).
    without = reveal(tmp_path, "without", WITHOUT_STUBS)
    with_stubs = reveal(tmp_path, "with", WITH_STUBS)
    types, output = revealed(without)
    assert len(types) == 6, output
    assert not [t for t in types.values() if "Never" in t], output
    assert types["get model"] == "Any", output
    assert types["get instance"] == "Any", output
    assert types["lock_all"] == "list[Any]", output
    assert "error" not in output, output  # the result is usable as a model (it is Any)

    types, output = revealed(with_stubs)
    job = "lockkit_tests.models.Job"
    assert types == {
        "get model": job,
        "get queryset": job,
        "get instance": job,
        "lock_all": f"list[{job}]",
        "scope.lock": f"django.db.models.query.QuerySet[{job}, {job}]",
        "lockkit.lock": f"django.db.models.query.QuerySet[{job}, {job}]",
    }, output
    assert "error" not in output, output
