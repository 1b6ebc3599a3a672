"""The jobs endpoints' request bodies: JSON objects parsed into dataclasses (``api.parse_body``).

Each dataclass checks its values in ``__post_init__`` with the services' own checks, so a malformed request is
refused with 400 before any SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sample_project.jobs.validation import check_name, check_payload, check_token, check_worker


@dataclass(frozen=True, kw_only=True)
class CreateJobBody:
    """``POST /jobs/``: ``{"name", "payload"?}``."""

    name: str
    payload: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        check_payload(self.payload)


@dataclass(frozen=True, kw_only=True)
class WorkerBody:
    """``POST /jobs/<id>/claim`` and ``POST /jobs/claim-next``: ``{"worker"}``."""

    worker: str

    def __post_init__(self) -> None:
        check_worker(self.worker, "worker")


@dataclass(frozen=True, kw_only=True)
class CompleteBody:
    """``POST /jobs/<id>/complete``: ``{"worker", "token", "result"?}``."""

    worker: str
    token: int
    result: Any = None

    def __post_init__(self) -> None:
        check_worker(self.worker, "worker")
        check_token(self.token)
