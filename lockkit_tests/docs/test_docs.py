"""The documentation keeps its promises: every code block runs or says why not, and every public name is in the
API reference.

The code blocks themselves run through Sybil (``conftest.py`` at the repository root, ``doc_examples.py``).
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import django
import pytest
from sybil import Document, Region
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, RawFencedCodeBlockLexer

from lockkit_tests.support import doc_examples

ROOT = Path(__file__).resolve().parents[2]
# Languages of blocks that are not Python and are shown, not run (commands, output, SQL, configuration files).
NOT_PYTHON = {"shell", "text", "sql", "ini", "toml", "yaml"}
# The modules whose ``__all__`` the API reference must cover (the optional ones once they exist).
PUBLIC_MODULES = (
    "lockkit",
    "lockkit.claims",
    "lockkit.testing",
    "lockkit.advisory.api",
    "lockkit.inspection",
    "lockkit.ddl",
    "lockkit.aio",
    "lockkit.signals",
)
# lockkit.tasks needs Django 6 (django.tasks); on Django 5.2 its reference entries are not resolved.
DJANGO_6_PUBLIC_MODULES = ("lockkit.tasks",)
# Checked when they import: they need their extra (opentelemetry-api, prometheus-client, djangorestframework).
OPTIONAL_PUBLIC_MODULES = ("lockkit.contrib.otel", "lockkit.contrib.prometheus", "lockkit.contrib.drf")
SKIP_WITH_REASON = re.compile(r'next\s+"[^"]{10,}"$')


def _documents() -> list[Path]:
    found = {path for pattern in doc_examples.DOCUMENTS for path in ROOT.glob(pattern)}
    return sorted(found)


def _regions(path: Path) -> list[tuple[str, Region]]:
    """The fenced blocks and the ``skip`` directives of a document, in order, from Sybil's own lexers."""
    document = Document(path.read_text(encoding="utf-8"), str(path))
    fences = RawFencedCodeBlockLexer(
        info_pattern=re.compile(r"(?P<info>[^\n]*)$\n", re.MULTILINE), mapping={"info": "info"}
    )
    skips = DirectiveInHTMLCommentLexer(directive="skip")
    regions = [("fence", region) for region in fences(document)]
    regions += [("skip", region) for region in skips(document)]
    return sorted(regions, key=lambda kind_region: kind_region[1].start)


def test_the_examples_cover_every_markdown_page() -> None:
    covered = set(_documents())
    pages = {path for path in (ROOT / "docs").rglob("*.md") if "```" in path.read_text(encoding="utf-8")}
    assert pages <= covered, f"pages with code blocks that no test runs: {sorted(map(str, pages - covered))}"


@pytest.mark.parametrize("path", _documents(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_code_block_runs_or_is_marked_not_runnable(path: Path) -> None:
    python_blocks = skipped = 0
    pending_skip = False
    for kind, region in _regions(path):
        line = path.read_text(encoding="utf-8").count("\n", 0, region.start) + 1
        where = f"{path.relative_to(ROOT)}:{line}"
        if kind == "skip":
            arguments = str(region.lexemes["arguments"]).strip()
            assert SKIP_WITH_REASON.match(arguments), f'{where}: write <!-- skip: next "the reason" -->'
            pending_skip = True
            continue
        language = str(region.lexemes["info"]).strip().split(" ")[0]
        if language == "python":
            python_blocks += 1
            skipped += pending_skip
        else:
            assert language in NOT_PYTHON, (
                f"{where}: a code block needs a language: python (run by the suite) or one of {sorted(NOT_PYTHON)}"
            )
            assert not pending_skip, f"{where}: a skip directive before a block that is not Python"
        pending_skip = False
    assert not pending_skip, f"{path}: a skip directive with no code block after it"
    assert skipped <= python_blocks


def _documented_objects() -> set[int]:
    documented: set[int] = set()
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        for dotted in re.findall(r"^::: (\S+)", page.read_text(encoding="utf-8"), re.MULTILINE):
            if django.VERSION < (6, 0) and dotted.startswith(DJANGO_6_PUBLIC_MODULES):
                continue
            documented.add(id(_resolve(dotted)))
    return documented


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(dotted)


def test_the_api_reference_documents_every_public_name() -> None:
    documented = _documented_objects()
    modules = list(PUBLIC_MODULES)
    if django.VERSION >= (6, 0):
        modules += DJANGO_6_PUBLIC_MODULES
    for name in OPTIONAL_PUBLIC_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        modules.append(name)
    missing = [
        f"{module}.{name}"
        for module in modules
        for name in importlib.import_module(module).__all__
        if not name.startswith("__") and id(getattr(importlib.import_module(module), name)) not in documented
    ]
    assert not missing, f"public names missing from docs/reference/*.md (add a `::: name` line): {missing}"


def test_the_system_check_hint_points_at_the_documentation_site() -> None:
    from lockkit.links import DOCS_URL
    from lockkit.system_checks import check_configuration

    # The test settings' SQLite alias has no transaction_mode = "IMMEDIATE": lockkit.W001 warns about it.
    (warning,) = [message for message in check_configuration() if message.obj == "sqlite"]
    # The section that says how to set transaction_mode (the capability report's did not).
    assert warning.hint == f"See {DOCS_URL}backends/#sqlite"
    # MkDocs builds that anchor from this heading (mkdocs build --strict checks the links between pages).
    backends = (ROOT / "docs" / "backends.md").read_text(encoding="utf-8")
    assert "\n## SQLite\n" in backends
    assert "transaction_mode" in backends.split("\n## SQLite\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_says_how_long_the_tests_take_and_gives_a_fast_subset_that_collects() -> None:
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert re.search(
        r"Run the tests \(the whole suite, as CI runs it: about \d+ minutes on two cores", quick_start
    )
    section = readme.split("## Running the tests\n", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"under 5 minutes on\s+two\s+cores\s+\(about \d minutes,\s+about \d+ tests\)", section)
    (command,) = re.findall(r"```shell\n(.+)\n```", section)
    args = shlex.split(command)
    assert args[:3] == [".venv/bin/python", "-m", "pytest"]
    # The subset's paths and marker expression stay valid: collected here as the reader would run it.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *args[3:]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env=os.environ.copy(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    collected = int(re.search(r"(\d+)/\d+ tests collected", done.stdout).group(1))  # type: ignore[union-attr]
    assert 400 < collected < 1200, done.stdout[-500:]
