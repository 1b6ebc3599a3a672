"""The embedded-server starter refuses a PostgreSQL major it cannot start, before starting anything."""

from __future__ import annotations

import pytest

from lockkit_harness import embedded


@pytest.mark.parametrize("text", ["17", "15", "eighteen", "18.4", "-16"])
def test_an_unbundled_major_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(embedded.MAJOR_ENV, text)
    with pytest.raises(ValueError, match=embedded.MAJOR_ENV):
        embedded.selected_major()


@pytest.mark.parametrize(("text", "major"), [("", 16), ("16", 16), (" 18 ", 18)])
def test_the_major_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, text: str, major: int) -> None:
    monkeypatch.setenv(embedded.MAJOR_ENV, text)
    assert embedded.selected_major() == major


def test_start_embedded_refuses_an_unbundled_major_before_starting_a_server() -> None:
    with pytest.raises(ValueError, match="major must be one of 16, 18"):
        embedded.start_embedded(17)


def test_an_existing_url_is_returned_without_starting_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKKIT_EMBEDDED_TEST_URL", "postgres://u@h:5432/d")
    assert embedded.database_url("LOCKKIT_EMBEDDED_TEST_URL") == "postgres://u@h:5432/d"
