"""The address of lockkit's documentation, for messages and system-check hints: one place to change it.

A placeholder until the site is published; mkdocs.yml (``site_url``) and pyproject.toml (``[project.urls]``) name
the same address.
"""

from __future__ import annotations

DOCS_URL = "https://lockkit.readthedocs.io/en/latest/"


def docs_url(page: str = "", anchor: str = "") -> str:
    """Return the address of a page of the documentation site.

    Args:
        page (str): The page's path in the site, as MkDocs builds it from ``docs/<page>.md``: ``"backends/"``.
        anchor (str): A heading's anchor on that page, without ``#``: ``"sqlite"``.

    Returns:
        str: The absolute URL, e.g. ``https://lockkit.readthedocs.io/en/latest/backends/#sqlite``.
    """
    return f"{DOCS_URL}{page}" + (f"#{anchor}" if anchor else "")
