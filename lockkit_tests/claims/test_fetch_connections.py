"""``claim_next(fetch=True)`` keeps no connection alive: its converters are kept per connection without holding it.

The converters of a claimed row are kept per connection (a weak key). MariaDB's are methods of the connection's
``ops``, which holds the connection: kept as bound methods they kept the key alive, and each thread that claimed and
ended without closing its connection left a server session open for good (found by a review helper: 30 threads, 30
sessions)."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest
from django.db import connections

from lockkit.claims import claim_next
from lockkit_tests.models import Job
from lockkit_tests.support.vendors import vendor_params

THREADS = 8


@pytest.mark.parametrize("alias", vendor_params())
def test_a_thread_that_claimed_and_ended_leaves_no_connection_behind(alias: str) -> None:
    Job.objects.using(alias).bulk_create([Job(name=f"j{i}") for i in range(THREADS)])
    kept: list[weakref.ref[Any]] = []
    names: list[str] = []
    errors: list[BaseException] = []

    def claim_once() -> None:
        try:
            ((job, claim),) = claim_next(
                Job.objects.using(alias).filter(state="pending"), worker="w", lease=60, fetch=True
            )
            names.append(job.name)
            assert job.lease_expires_at == claim.lease_expires_at  # converted as a queryset would
            kept.append(weakref.ref(connections[alias]))
        except BaseException as exc:
            errors.append(exc)
        # The thread ends without closing its connection, as a short-lived thread of a project's code may.

    for _ in range(THREADS):
        thread = threading.Thread(target=claim_once)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive()
    assert errors == []
    assert sorted(names) == sorted(f"j{i}" for i in range(THREADS))
    gc.collect()
    assert [ref() for ref in kept if ref() is not None] == []
