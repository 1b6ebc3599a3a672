"""Argument checks shared by the jobs services and request bodies: they run before any SQL."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any


def check_worker(worker_id: object, name: str = "worker_id") -> str:
    if not isinstance(worker_id, str):
        raise TypeError(f"{name} must be a str, not {type(worker_id).__name__}")
    if not worker_id:
        raise ValueError(f"{name} must not be empty")
    return worker_id


def check_job_id(job_id: object) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise TypeError(f"job_id must be an int, not {type(job_id).__name__}")
    if job_id < 1:
        raise ValueError(f"job_id must be a positive int, got {job_id}")
    return job_id


def check_lease(lease: object) -> timedelta:
    if isinstance(lease, timedelta):
        value = lease.total_seconds()
    elif isinstance(lease, int | float) and not isinstance(lease, bool):
        value = float(lease)
    else:
        raise TypeError(f"lease must be seconds (int/float) or a timedelta, not {type(lease).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"lease must be a positive, finite duration, got {lease!r}")
    return timedelta(seconds=value)


def check_token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be an int, not {type(token).__name__}")
    return token


def check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("name must not be empty")
    return name


def check_payload(payload: object) -> dict[str, Any] | None:
    if payload is not None and not isinstance(payload, dict):
        raise TypeError(f"payload must be a dict or None, not {type(payload).__name__}")
    return payload
