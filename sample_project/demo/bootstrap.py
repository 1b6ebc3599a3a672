"""Configuring Django in a demo process, and writing a database alias's settings back as a URL."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

SETTINGS_MODULE = "sample_project.settings"
DATABASE_URL_ENV = "SAMPLE_DATABASE_URL"


def bootstrap(url: str) -> None:
    """Point this process at ``url`` with the sample settings and set Django up (in a worker process)."""
    os.environ[DATABASE_URL_ENV] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    import django

    django.setup()


def url_of(settings_dict: dict[str, Any]) -> str:
    """A ``postgres://`` URL for a Django PostgreSQL ``DATABASES`` entry (hands a test database to workers).

    Raises:
        ValueError: the entry is not a PostgreSQL database.
    """
    if "postgresql" not in settings_dict.get("ENGINE", ""):
        raise ValueError(f"the demo needs PostgreSQL, not {settings_dict.get('ENGINE')!r}")
    user = quote(str(settings_dict.get("USER") or ""), safe="")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = quote(str(settings_dict.get("HOST") or ""), safe="")
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{quote(str(settings_dict['NAME']), safe='')}"
