"""Entry points for test worker processes (importable by ``spawn``)."""

from __future__ import annotations

import time
from typing import Any

from sample_project.demo.bootstrap import bootstrap


def claim_and_hang(url: str, claimed: Any) -> None:
    """Claim the next job, say so, and hang "working" until killed."""
    bootstrap(url)
    from sample_project.jobs.services import claim_next_job

    if claim_next_job("doomed", lease=60) is not None:
        claimed.set()
    time.sleep(120)
