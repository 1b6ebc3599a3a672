"""ASGI entry point, e.g. ``uvicorn sample_project.asgi:application`` (the async endpoint's natural server)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sample_project.settings")

application = get_asgi_application()
