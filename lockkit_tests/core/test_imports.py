"""The import structure of lockkit: every module imports alone, the module graph has no cycles, the layers hold.

The graph is read from the source with ``ast`` (function-level imports included, ``if TYPE_CHECKING:`` blocks left
out: they never run), so a cycle hidden inside a function is caught as well as one at module level.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import lockkit

ROOT = Path(lockkit.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str) -> set[str]:
    """The lockkit modules ``module`` imports anywhere in its body (its own package's ``__init__`` excluded)."""
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            # ``from lockkit import claims`` imports the submodule; ``from lockkit.errors import X`` the module.
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names
            ]
        found.update(name for name in names if name in MODULES and name != module)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def test_the_module_list_is_complete() -> None:
    assert {
        "lockkit",
        "lockkit.errors",
        "lockkit.errorcodes.table",
        "lockkit.errorcodes.translate",
        "lockkit.scopes.scope",
    } <= set(MODULES)


def test_lockkit_has_no_import_cycles() -> None:
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        path.append(module)
        for target in sorted(GRAPH[module]):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(GRAPH):
        visit(module)
    assert done == set(MODULES)


def test_the_layers_contract_holds() -> None:
    """``lint-imports`` (pyproject's ``[tool.importlinter]``): foundation < vendors < scopes < operations < features."""
    command = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(command), "--no-cache"], capture_output=True, text=True, cwd=ROOT.parent, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_the_graph_includes_function_level_imports_and_skips_type_checking_ones() -> None:
    assert "lockkit.claims" in GRAPH["lockkit"]  # imported inside lockkit.__getattr__
    assert "lockkit.testing" in GRAPH["lockkit.pytest_plugin"]  # inside the fixture, and under TYPE_CHECKING
    assert "lockkit.scopes.stack" in GRAPH["lockkit.claims.api"]  # at module level


# Imports one module into a process where no lockkit module was imported before: a fresh interpreter (the
# server below) imports Django only, then forks a child per module, which configures settings and imports it. The
# same as a fresh interpreter per module as far as lockkit is concerned (Django, psycopg and tenacity are imported
# before, once), without starting one each time: 145 interpreters took over two minutes of every suite run.
_ALONE = """
import importlib, json, os, sys, tempfile, traceback
import django
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
# What the modules need from elsewhere, imported once here (no lockkit module imports before its own import).
import django.db.models, django.http, django.urls, psycopg, tenacity  # noqa: E401,F401


def alone(module):
    tasks = module == "lockkit.tasks" or module.startswith("lockkit.tasks.")
    # lockkit.tasks is a Django 6 app (its models need it installed); on older Django importing it must fail clearly.
    settings.configure(INSTALLED_APPS=["lockkit.tasks"] if tasks and django.VERSION >= (6, 0) else [], DATABASES={})
    if tasks and django.VERSION < (6, 0):
        try:
            importlib.import_module(module)
        except ImproperlyConfigured as error:
            assert "lockkit.tasks needs Django 6.0 or later" in str(error), error
        else:
            raise AssertionError("imported on Django < 6")
        return
    django.setup()
    importlib.import_module(module)


for line in sys.stdin:
    module = line.strip()
    with tempfile.TemporaryFile("w+") as errors:
        pid = os.fork()
        if pid == 0:
            os.dup2(errors.fileno(), 2)
            code = 0
            try:
                alone(module)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        errors.seek(0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status), "stderr": errors.read()}), flush=True)
"""


@pytest.fixture(scope="module")
def importer() -> Iterator[subprocess.Popen[str]]:
    """The process that imports each module alone (``_ALONE``), stopped at the end of the module's tests."""
    process = subprocess.Popen(
        [sys.executable, "-c", _ALONE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=60)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_alone(module: str, importer: subprocess.Popen[str]) -> None:
    assert importer.stdin is not None
    assert importer.stdout is not None
    importer.stdin.write(module + "\n")
    importer.stdin.flush()
    result = json.loads(importer.stdout.readline())
    assert result["code"] == 0, result["stderr"]
