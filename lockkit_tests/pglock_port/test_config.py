"""django-pglock's ``tests/test_config.py`` on ``lockkit_locks``'s presets: pglock's ``PGLOCK_CONFIGS`` (named sets
of the command's options, ``pglock -c NAME``) are ``settings.LOCKKIT["LOCKS_PRESETS"]`` (``lockkit_locks --preset
NAME``, or ``-c``/``--config``); options given on the command line win over the preset's.

pglock's ``PGLOCK_ATTRIBUTES``/``PGLOCK_BLOCKING_ATTRIBUTES`` (the columns shown) have no lockkit counterpart:
lockkit's views have fixed fields (``--expanded`` shows them all, ``--json`` every field of the records).
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from lockkit.management.locks_options import preset

PRESETS: dict[str, dict[str, Any]] = {
    "test": {"expanded": True},
    "blocking": {"blocking": True, "min_wait": 20},
    "attributes": {"blocking": True, "json": True},
    "elsewhere": {"database": "no-such-alias", "json": True},
    "nobody": {"pids": [2000000000]},
}


@pytest.fixture
def presets(settings: Any) -> dict[str, dict[str, Any]]:
    settings.LOCKKIT = {"LOCKS_PRESETS": PRESETS}
    return PRESETS


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("lockkit_locks", *args, stdout=out)
    return out.getvalue()


def test_get(presets: dict[str, dict[str, Any]]) -> None:
    """Ports pglock's ``test_get``: ``config.get("bad")`` raises ``ValueError``; a named config gives its values;
    no name gives the defaults."""
    with pytest.raises(ValueError, match=r"no preset 'bad' in settings.LOCKKIT\['LOCKS_PRESETS'\]") as caught:
        preset("bad")
    assert "known: attributes, blocking, elsewhere, nobody, test" in str(caught.value)
    assert preset("test") == {"expanded": True}
    assert preset("blocking") == {"blocking": True, "min_wait": 20.0}
    assert preset("attributes") == {"blocking": True, "json": True}
    assert preset(None) == {}
    assert preset("test") is not PRESETS["test"]  # a copy: the command's overrides never edit the setting


@pytest.mark.django_db(transaction=True)
def test_the_command_applies_a_preset_and_the_command_line_wins(presets: dict[str, dict[str, Any]]) -> None:
    """Ports pglock's ``test_get`` through the command (pglock's ``-c NAME`` and its overrides)."""
    with pytest.raises(CommandError, match="no preset 'bad'"):
        _run("--preset", "bad")
    assert _run("-c", "attributes").strip() == "[]"  # blocking + json: the JSON list of blockers
    assert json.loads(_run("--config", "attributes")) == []
    assert _run("--preset", "test").startswith("default: 0 session(s) waiting")
    assert _run("--preset", "blocking").startswith("default: 0 session(s) blocking others")
    with pytest.raises(CommandError, match="unknown database alias: no-such-alias"):
        _run("--preset", "elsewhere")
    assert json.loads(_run("--preset", "elsewhere", "--database", "default")) == []  # the command line wins
    assert _run("--preset", "nobody").strip() == "default: 0 session(s) waiting for a lock"


@pytest.mark.parametrize(
    ("presets_value", "message"),
    [
        ({"x": {"limit": 3}}, "preset 'x' sets unknown option 'limit'"),
        ({"x": {"blocking": "yes"}}, "preset 'x': 'blocking' must be bool"),
        ({"x": {"min_wait": True}}, "preset 'x': 'min_wait' must be int or float"),
        ({"x": {"min_wait": -1}}, "the minimum wait must be a finite number"),
        ({"x": {"pids": [0]}}, "a preset's pids must be positive ints"),
        ({"x": ["blocking"]}, "preset 'x' must be a dict of options"),
        ("not a dict", "no preset 'x'"),
    ],
)
def test_a_bad_preset_is_refused_with_its_name(settings: Any, presets_value: Any, message: str) -> None:
    """Beyond pglock's ``test_get`` (which does not check a config's contents): a preset that sets an unknown
    option or a value of the wrong type is refused naming the preset and the option."""
    settings.LOCKKIT = {"LOCKS_PRESETS": presets_value}
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace("[", "\\[")):
        preset("x")
