"""``GET /metrics``: the Prometheus metrics of the process (lockkit's when ``lockkit.contrib.prometheus`` is installed).

The sample settings install it through ``LOCKKIT["OBSERVERS"]``. See docs/observability.md.
"""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest


@transaction.non_atomic_requests  # a scrape reads no table: no transaction, no connection
def metrics(request: HttpRequest) -> HttpResponse:
    """Every metric of the default registry, in Prometheus' text format."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
